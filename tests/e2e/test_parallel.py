"""End to end, the seed-determinism promise in each way of sharing work: a task's image is the one a
single unbatched rank makes for its (prompt, seed, size), whether it was batched, generated on
another rank (data parallel: the same bytes) or split across ranks (context parallel, Ulysses).
Batching and context parallelism may change kernel rounding: within 1/255 per pixel."""

from __future__ import annotations

import io
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
import torch
from PIL import Image

from launch.local import REPO
from tests.harness import settled_worker
from worker.config import ModelConfig, load_config
from worker.storage.encode import encode_image
from worker.model.engine import Engine
from worker.model.job import Job

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


@pytest.fixture(scope="module")
def reference(tiny_model):
    """What one unbatched rank in this process makes for a task input, with the workers' [speed]."""
    engine = Engine.load(ModelConfig(source=str(tiny_model), dtype="float32", device="cpu", max_sequence_length=64),
                         torch.device("cpu"), load_config(REPO / "configs" / "tiny.toml").speed)

    def make(inp: dict) -> np.ndarray:
        # One thread, like each worker rank (launch.local): oneDNN's channels_last convolutions on a
        # CPU round differently with another thread count.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return _generate(inp)
        finally:
            torch.set_num_threads(threads)

    def _generate(inp: dict) -> np.ndarray:
        return engine.generate(Job(task_id="ref", prompt=inp["prompt"], width=inp["width"], height=inp["height"],
                                   steps=4, seed=inp["seed"], output_format="png")).pixels
    return make


def inputs(n: int, size=(192, 128)) -> list[dict]:
    # PNG: the comparisons are of pixels, which the default (JPEG) would not keep.
    return [{"prompt": f"a harbour at dusk, boat {i}", "seed": 100 + i, "width": size[0], "height": size[1],
             "output_format": "png"} for i in range(n)]


def serve(stack, inps: list[dict]) -> list[dict]:
    ids = [stack.client.submit(i)["id"] for i in inps]
    done = stack.client.wait(ids, 180, proc=stack.proc)
    tasks = [done[i] for i in ids]
    for t in tasks:
        assert t["status"] == "succeeded", t["error"]
    return tasks


def pixels(task: dict) -> np.ndarray:
    data = Path(urlparse(task["result"]["uri"]).path).read_bytes()
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def max_diff(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(a.astype(int) - b.astype(int)).max())


def test_data_parallel_two_ranks_same_bytes_reports_in_lease_order(make_stack, reference):
    stack = make_stack()
    stack.proc = stack.worker(nproc=2, overrides=["parallel.mode=data", "batch.max_size=1"])
    inps = inputs(6)
    tasks = serve(stack, inps)
    assert {t["result"]["rank"] for t in tasks} == {0, 1}  # both ranks generated
    for inp, task in zip(inps, tasks):
        assert pixels(task).tobytes() == reference(inp).tobytes()
        assert Path(urlparse(task["result"]["uri"]).path).read_bytes() == encode_image(reference(inp), "png")[0]
    # Leased in submission order; reported in lease order although post-processing overlaps.
    finished = [t["finished_at"] for t in tasks]
    assert finished == sorted(finished)


def test_batched_within_one_level_of_unbatched(make_stack, reference):
    stack = make_stack()
    stack.proc = stack.worker(nproc=1, overrides=["batch.max_size=4", "batch.window_s=2.0"])
    inps = inputs(4)
    tasks = serve(stack, inps)
    assert max(t["result"]["batch_size"] for t in tasks) > 1  # they really were batched
    for inp, task in zip(inps, tasks):
        assert max_diff(pixels(task), reference(inp)) <= 1
        assert task["result"]["seed"] == inp["seed"]


def test_context_parallel_ulysses_within_one_level_of_one_rank(make_stack, reference):
    stack = make_stack()
    stack.proc = stack.worker(nproc=2, overrides=["parallel.mode=context", "batch.max_size=2"])
    inps = inputs(3)
    tasks = serve(stack, inps)
    for inp, task in zip(inps, tasks):
        assert max_diff(pixels(task), reference(inp)) <= 1
    assert "context parallel: ulysses over 2 ranks" in stack.proc.output()
    # 272x80 makes 17 x 5 = 85 image tokens + 64 text tokens: not divisible across 2 ranks.
    bad = stack.client.submit({"prompt": "odd", "width": 272, "height": 80})["id"]
    task = stack.client.wait([bad], 60, proc=stack.proc)[bad]
    assert task["status"] == "failed" and task["error"]["code"] == "invalid_request"
    assert "not divisible by the 2 context-parallel ranks" in task["error"]["message"]


def test_four_ranks_keep_generating_while_a_slow_post_stage_holds_max_pending(make_stack):
    stack = make_stack()
    ids = [stack.client.submit({"prompt": f"slow post {i}", "width": 128, "height": 128})["id"] for i in range(16)]
    # Each image check takes 0.8 s: the post stage (auto-sized: 4 threads, max_pending 2 rounds = 8),
    # not generation, limits the node. The old fixed default (max_pending 4) made every round wait.
    stack.proc = stack.worker(nproc=4, overrides=[
        "safety.image.backend=custom", "safety.image.custom.factory=tests.safety.backends:slow",
        "safety.image.custom.options={ seconds = 0.8 }"])
    done = stack.client.wait(ids, 180, proc=stack.proc)
    tasks = [done[i] for i in ids]
    assert all(t["status"] == "succeeded" for t in tasks), [t["error"] for t in tasks]
    assert {t["result"]["rank"] for t in tasks} == {0, 1, 2, 3}
    counters = settled_worker(stack)["counters"]
    # Rank 0 went on generating while two rounds waited in the post stage, and never held more: with
    # the old settle limit (max_pending - ranks) every round waited for all post-processing.
    assert counters["unreported_max"] == counters["max_pending"] == 8
    settle = [t["result"]["timings_ms"]["settle"] for t in tasks]  # a round's wait for room
    assert settle[0] < 100  # the first round found room at once...
    assert max(settle) > 200  # ...later ones waited for the slow post stage, as far as max_pending
