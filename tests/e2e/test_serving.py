"""End to end: the real scheduler on 127.0.0.1 and a 2-rank torchrun worker (gloo) serving it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import urlparse

import pytest
from PIL import Image

from tests.harness import Stack, ready_worker, run

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model):
    """One stack and one 2-rank worker shared by this module's tests."""
    stack = Stack(tmp_path_factory.mktemp("serving"), tiny_model)
    stack.proc = stack.worker(nproc=2)
    yield stack
    stack.close()


def path_of(task: dict) -> Path:
    return Path(urlparse(task["result"]["uri"]).path)


def test_tasks_succeed_with_images_of_the_requested_size_in_the_default_format(served):
    sizes = [(256, 256), (384, 128), (128, 512)]
    tasks = run(served, [{"prompt": f"prompt {i}", "width": w, "height": h} for i, (w, h) in enumerate(sizes)])
    for task, (w, h) in zip(tasks, sizes):
        assert task["status"] == "succeeded", task["error"]
        assert task["attempts"] == 1
        result, path = task["result"], path_of(task)
        assert path.parent == served.images.resolve() and path.name == f"{task['id']}.jpg"
        data = path.read_bytes()
        assert hashlib.sha256(data).hexdigest() == result["sha256"] and len(data) == result["bytes"]
        with Image.open(path) as img:
            assert img.format == "JPEG" and img.size == (w, h) and img.mode == "RGB"
        assert (result["width"], result["height"]) == (w, h)
        assert set(result["timings_ms"]) >= {"generate", "encode", "store"}


def test_worker_registered_with_two_ranks_and_heartbeats(served):
    workers = served.registered()
    assert len(workers) == 1
    w = workers[0]
    assert w["world_size"] == 2 and len(w["devices"]) == 2 and w["model"] == "tiny-flux"
    assert w["status"] == "ready" and w["last_heartbeat"] is not None


def test_same_seed_same_bytes_and_default_seed_is_reproducible(served):
    a, b, c = run(served, [{"prompt": "a fox", "seed": 5}, {"prompt": "a fox", "seed": 5},
                           {"prompt": "a fox", "seed": 6}])
    assert a["result"]["sha256"] == b["result"]["sha256"] != c["result"]["sha256"]
    drawn, = run(served, [{"prompt": "a fox"}])
    again, = run(served, [{"prompt": "a fox", "seed": drawn["result"]["seed"]}])
    assert drawn["result"]["sha256"] == again["result"]["sha256"]


# What the worker alone refuses (types, unknown fields); a missing or blank prompt is refused at
# submission by the protocol, and values outside the live workers' limits too (below).
INVALID = [
    ({"prompt": "x", "width": "256"}, "width: Input should be a valid integer"),
    ({"prompt": "x", "seed": "lucky"}, "seed: Input should be a valid integer"),
    ({"prompt": "x", "negative_prompt": "y"}, "negative_prompt: unknown field"),
]


def test_invalid_requests_fail_with_a_reason_and_the_worker_keeps_serving(served):
    before = served.objects()
    tasks = run(served, [i for i, _ in INVALID] + [{"prompt": "still serving", "width": 256}])
    for task, (_, reason) in zip(tasks, INVALID):
        assert task["status"] == "failed"
        err = task["error"]
        assert err["code"] == "invalid_request" and reason in err["message"] and err["retryable"] is False
        assert task["attempts"] == 1  # not retried: a retry cannot fix the input
    assert tasks[-1]["status"] == "succeeded"
    assert len(served.objects()) == len(before) + 1
    assert served.proc.alive()


UNSERVABLE = [
    ({"prompt": "x" * 2001}, "input.prompt: 2001 characters is above every live worker's limit (2000)"),
    ({"prompt": "x", "width": 100}, "input.width: 100 is not a multiple of 16, as every live worker requires"),
    ({"prompt": "x", "height": 4096}, "input.height: 4096 is above every live worker's limit (1536)"),
    ({"prompt": "x", "steps": 9}, "input.steps: 9 is above every live worker's limit (8)"),
]


def test_inputs_outside_the_live_workers_advertised_limits_are_refused_at_submission(served):
    worker = ready_worker(served, served.proc)
    assert worker["limits"]["max_side"] == 1536 and worker["limits"]["size_multiple"] == 16  # configs/tiny.toml
    for inp, why in UNSERVABLE:
        resp = served.client.http.post("/v1/tasks", json={"input": inp})
        assert resp.status_code == 422 and resp.json()["detail"] == why


def test_same_image_with_one_and_two_ranks(served, make_stack):
    job = {"prompt": "a lighthouse at dawn", "seed": 1234, "width": 320, "height": 192}
    two, = run(served, [job])
    single = make_stack()
    single.proc = single.worker(nproc=1)
    one, = run(single, [job])
    assert one["status"] == two["status"] == "succeeded"
    assert path_of(one).read_bytes() == path_of(two).read_bytes()
    assert single.registered()[0]["world_size"] == 1
