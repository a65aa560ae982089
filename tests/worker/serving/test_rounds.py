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
