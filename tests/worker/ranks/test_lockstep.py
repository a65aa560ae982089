"""Lockstep generation in a one-rank gloo group: outcome per job, failure capture, shares."""

import numpy as np

from worker.ranks.distributed import DistContext
from worker.model.engine import Batch, Picture
from worker.ranks.lockstep import Swap, generate, model_of, swap
from worker.model.parallel import sequence_fits
from worker.ranks.sharing import capacity, mine, slots
from worker.model.job import Job

JOB = Job(task_id="t", prompt="p", width=64, height=64, steps=1, seed=3, output_format="png")


class FakeEngine:
    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.batches: list[int] = []

    def generate_batch(self, jobs: list[Job]) -> Batch:
        if self.fail:
            raise self.fail
        self.batches.append(len(jobs))
        return Batch([Picture(np.full((j.height, j.width, 3), j.seed, np.uint8)) for j in jobs],
                     {"denoise": 1.0})


def test_single_process_group(ctx: DistContext):
    assert (ctx.rank, ctx.world_size, ctx.backend, ctx.coordinator, ctx.is_coordinator) == (0, 1, "gloo", 0, True)


def test_success_returns_the_image(ctx):
    [out] = generate(FakeEngine(), [[JOB]], ctx)
    assert out.errors == [] and out.pictures[0].pixels.shape == (64, 64, 3)
    assert out.timings["denoise"] == 1.0 and {"gather", "generate"} <= set(out.timings) and out.batch_size == 1


def test_a_round_gives_one_outcome_per_job_in_order(ctx):
    jobs = [JOB.model_copy(update={"task_id": f"t{i}", "seed": i}) for i in range(3)]
    engine = FakeEngine()
    outs = generate(engine, [jobs], ctx, per_pass=3)
    assert [int(o.pictures[0].pixels[0, 0, 0]) for o in outs] == [0, 1, 2]
    assert engine.batches == [3] and {o.batch_size for o in outs} == {3}


def test_a_failing_rank_is_reported_not_raised(ctx):
    [out] = generate(FakeEngine(RuntimeError("CUDA out of memory")), [[JOB]], ctx)
    assert out.pictures == [] and out.errors == ["rank 0: RuntimeError: CUDA out of memory"]


def test_a_job_of_several_images_makes_each_with_its_seed_in_passes_of_the_batch_size(ctx):
    four = JOB.model_copy(update={"task_id": "four", "seed": 10, "num_images": 4})
    engine = FakeEngine()
    one, several = generate(engine, [[JOB, four]], ctx, per_pass=2)
    assert [int(p.pixels[0, 0, 0]) for p in one.pictures] == [3]
    assert [int(p.pixels[0, 0, 0]) for p in several.pictures] == [10, 11, 12, 13]
    # Five images, two a pass (the batch sizes warmed up): 2 + 2 + 1, each pass's time summed.
    assert engine.batches == [2, 2, 1] and several.batch_size == 2 and several.timings["denoise"] == 3.0


def test_a_failed_pass_fails_every_job_of_the_round(ctx):
    class FailsSecond(FakeEngine):
        def generate_batch(self, jobs):
            if self.batches:
                raise RuntimeError("out of memory")
            return super().generate_batch(jobs)

    outs = generate(FailsSecond(), [[JOB.model_copy(update={"num_images": 3})]], ctx, per_pass=2)
    assert [(o.pictures, o.errors) for o in outs] == [([], ["rank 0: RuntimeError: out of memory"])]


def test_each_rank_makes_its_own_batch_in_data_mode_and_all_make_one_in_context_mode():
    batches = [["a", "b"], ["c"]]
    assert [mine(batches, r, "data") for r in range(3)] == [["a", "b"], ["c"], []]  # rank 2 idles
    assert [mine(batches[:1], r, "context") for r in range(3)] == [["a", "b"]] * 3
    assert slots(3, "data") == 3 and slots(3, "context") == 1
    assert capacity(4, 2, "data") == 8 and capacity(4, 2, "context") == 4


def test_context_parallel_refuses_sequences_that_do_not_split():
    assert sequence_fits(256, 256, 64, 2) is None
    assert "not divisible" in sequence_fits(272, 16 * 3, 64, 2)


class FakeResident:
    """worker.model.resident.Resident's bookkeeping, with loads that succeed or raise."""

    def __init__(self, fails: set[str] = frozenset()) -> None:
        self.engines, self.fails, self.log = {"a": FakeEngine()}, fails, []

    def names(self):
        return list(self.engines)

    def engine(self, name):
        return self.engines[name]

    def evict(self, name):
        self.log.append(f"evict {name}")
        self.engines.pop(name, None)

    def load(self, name):
        self.log.append(f"load {name}")
        if name in self.fails:
            raise OSError(f"{name}: no such directory")
        self.engines[name] = FakeEngine()


def test_a_swap_evicts_then_loads_and_every_rank_agrees(ctx):
    resident = FakeResident()
    assert swap(resident, Swap("b", ("a",)), ctx) == []
    assert resident.log == ["evict a", "load b"] and resident.names() == ["b"]
    [out] = generate(resident.engine(model_of([[JOB.model_copy(update={"model": "b"})]], resident)), [[JOB]], ctx)
    assert out.errors == []


def test_a_failed_load_is_reported_and_leaves_nothing_of_it(ctx):
    resident = FakeResident(fails={"b"})
    assert swap(resident, Swap("b"), ctx) == ["rank 0: OSError: b: no such directory"]
    assert resident.names() == ["a"]  # nothing evicted: the others still serve


def test_a_job_naming_no_model_is_the_model_loaded_at_start():
    assert model_of([[JOB]], FakeResident()) == "a"


def test_a_one_rank_group_passes_objects_without_a_collective(ctx, monkeypatch):
    """One rank has no one to send to: no pickled copy of a command or an image through the device,
    each of which waited for the GPU's queue to drain between rounds."""
    import torch.distributed as dist

    from worker.ranks.distributed import all_gather, broadcast, gather

    def collective(*_a, **_k):
        raise AssertionError("a collective ran in a one-rank group")

    for name in ("broadcast_object_list", "gather_object", "all_gather_object"):
        monkeypatch.setattr(dist, name, collective)
    command, image = object(), np.zeros((4, 4, 3), np.uint8)
    assert broadcast(command, ctx) is command
    assert gather(image, ctx)[0] is image and all_gather(image, ctx)[0] is image
    [out] = generate(FakeEngine(), [[JOB]], ctx)  # the round's closing gather, too
    assert out.errors == [] and out.pictures[0].pixels.shape == (64, 64, 3)
