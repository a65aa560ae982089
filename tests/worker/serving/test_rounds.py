"""The round policy: the oldest task always goes, each rank makes one shape, the other ranks take
the batches that fill the round without lengthening it."""

from __future__ import annotations

from dataclasses import dataclass

from worker.serving.rounds import cost, full, plan


@dataclass(eq=False)
class T:
    id: str
    w: int
    h: int = 256
    steps: int = 4
    images: int = 1

    @property
    def shape(self):
        return (self.w, self.h, self.steps)


def names(batches) -> list[list[str]]:
    return [[t.id for t in b] for b in batches]


def test_nothing_ready_plans_nothing():
    assert plan([], 2, 1) == []


def test_uniform_traffic_fills_every_rank_with_whole_batches():
    ready = [T(f"t{i}", 512) for i in range(9)]
    assert names(plan(ready, 2, 4)) == [["t0", "t1", "t2", "t3"], ["t4", "t5", "t6", "t7"]]
    assert full(plan(ready, 2, 4), 2, 4) and not full(plan(ready[:5], 2, 4), 2, 4)


def test_mixed_sizes_spread_over_ranks_one_shape_per_rank():
    ready = [T("a", 256), T("b", 384), T("c", 512), T("d", 256)]
    # The oldest (a); then the batch of the same cost (d) rather than a longer round.
    assert names(plan(ready, 2, 1)) == [["a"], ["d"]]
    # Four ranks: when nothing fits under the longest, the oldest of what is left goes.
    assert names(plan(ready, 4, 1)) == [["a"], ["d"], ["b"], ["c"]]


def test_a_bigger_head_takes_the_biggest_batch_that_fits_oldest_first():
    ready = [T("big", 512, 512), T("s1", 256), T("m1", 384), T("m2", 384)]
    assert names(plan(ready, 2, 1)) == [["big"], ["m1"]]


def test_batches_of_one_shape_stay_on_one_rank():
    ready = [T("a", 256), T("b", 512), T("c", 256), T("d", 512)]
    assert names(plan(ready, 2, 2)) == [["a", "c"], ["b", "d"]]
    assert cost([T("x", 256)] * 2) == 2 * 256 * 256 * 4


def test_the_oldest_task_is_never_passed_over():
    ready = [T("old", 1024, 1024)] + [T(f"s{i}", 256) for i in range(6)]
    assert names(plan(ready, 1, 1)) == [["old"]]
    assert names(plan(ready, 3, 2))[0] == ["old"]


def test_a_batch_counts_images_not_tasks():
    ready = [T("a2", 512, images=2), T("b1", 512), T("c2", 512, images=2), T("d1", 512)]
    # Four images a batch: a2 + b1 leave room for one, and c2 does not fit; d1 does, but a batch keeps
    # lease order, so c2 starts the next one.
    assert names(plan(ready, 2, 4)) == [["a2", "b1"], ["c2", "d1"]]
    assert cost(plan(ready, 2, 4)[0]) == 512 * 256 * 4 * 3
    assert not full(plan(ready, 2, 4), 2, 4)
    assert full(plan([T("x", 512, images=4), T("y", 512, images=2), T("z", 512, images=2)], 2, 4), 2, 4)


def test_a_task_of_more_images_than_a_batch_is_a_batch_alone_and_full():
    ready = [T("one", 256), T("four", 256, images=4), T("two", 256)]
    # Cut in lease order; the round then takes what fits beside the oldest first.
    assert names(plan(ready, 3, 2)) == [["one"], ["two"], ["four"]]
    assert full([[T("four", 256, images=4)]], 1, 2)


def test_the_round_balances_by_images():
    # A rank making four images of 256 costs as much as one making one of 512x512.
    ready = [T("big", 512, 512), T("four", 256, images=4), T("one", 256)]
    assert cost([ready[1]]) == cost([ready[0]])
    assert names(plan(ready, 2, 4)) == [["big"], ["four"]]
