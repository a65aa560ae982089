"""Rank 0's post stage: the encoder works on the pixels while the image check looks at them, and
only a checked image is stored. Overlap is shown by events (the check waits for the encoder to have
finished), never by timing."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from protocol import ErrorCode, Lease, TaskResult
from safety.config import SafetyConfig
from safety.guard import Guard
from safety.verdicts import Verdict
from worker.config import EncodeConfig
from worker.model.engine import Picture
from worker.model.job import Job
from worker.ranks.lockstep import Generated
from worker.serving import post as post_module
from worker.serving.ledger import Ledger, Stage
from worker.serving.post import PostStage
from worker.serving.state import WorkerState
from worker.serving.task import Task
from worker.storage import LocalStore
from worker.storage.encode import encode_image

PIXELS = np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8)


class WaitingImageCheck:
    """Refuses or passes, but only once the encoder has finished with the same pixels: a post stage
    that encoded after the check would leave it waiting, and the test fails on the wait."""

    name = "waiting"

    def __init__(self, encoded: threading.Event, refuse: bool = False) -> None:
        self.encoded = encoded
        self.refuse = refuse
        self.saw_encoded: list[bool] = []

    def check(self, images: list[np.ndarray]) -> list[Verdict]:
        if images[0].shape == PIXELS.shape:  # not the guard's self-test
            self.saw_encoded.append(self.encoded.wait(10))
        return [Verdict(self.refuse, self.name, {"nsfw": float(self.refuse)}, "nsfw" if self.refuse else None,
                        1.0 if self.refuse else None) for _ in images]


@pytest.fixture
def encoded(monkeypatch) -> threading.Event:
    done = threading.Event()

    def encode_and_say(*args, **kw):
        out = encode_image(*args, **kw)
        done.set()
        return out

    monkeypatch.setattr(post_module, "encode_image", encode_and_say)
    return done


def make(tmp_path, check, quarantine: bool = False) -> tuple[PostStage, Ledger]:
    ledger = Ledger()
    guard = Guard(SafetyConfig(), None, check)
    out, review = LocalStore(tmp_path / "out"), LocalStore(tmp_path / "review")
    for store in (out, review):
        store.check_writable()  # makes the directory, as the worker does at start
    post = PostStage(guard, out, review if quarantine else None, WorkerState(), ledger, EncodeConfig(), "test",
                     False, 1)
    return post, ledger


def held_task(ledger: Ledger, fmt: str = "jpeg") -> Task:
    task = Task(Lease(task_id="t-1", input={}, created_at=0.0, lease_token="tok", lease_deadline=0.0,
                      lease_ttl_s=60.0, attempt=1))
    task.job = Job(task_id="t-1", prompt="p", width=96, height=64, steps=4, seed=1, output_format=fmt)
    ledger.hold(task, Stage.ADMIT)
    ledger.advance(task, Stage.GENERATE)
    return task


def stored(root) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_the_encoder_runs_while_the_image_check_looks_and_the_image_is_stored(tmp_path, encoded):
    check = WaitingImageCheck(encoded)
    post, ledger = make(tmp_path, check)
    task = held_task(ledger, "png")
    result = post.submit(task, Generated(Picture(PIXELS), [])).result(30)
    post.shutdown()
    assert check.saw_encoded == [True]
    assert isinstance(result, TaskResult) and result.content_type == "image/png"
    data, _ = encode_image(PIXELS, "png", EncodeConfig())
    assert result.bytes == len(data)  # the bytes encoded beside the check are the ones stored
    assert {"image_check", "encode", "store"} <= set(task.timings.as_dict())


def test_a_refused_image_is_never_stored_and_quarantine_keeps_the_bytes_already_encoded(tmp_path, encoded):
    check = WaitingImageCheck(encoded, refuse=True)
    post, ledger = make(tmp_path, check, quarantine=True)
    task = held_task(ledger)
    result = post.submit(task, Generated(Picture(PIXELS), [])).result(30)
    post.shutdown()
    assert result.code == ErrorCode.UNSAFE_IMAGE and not result.retryable
    assert stored(tmp_path / "out") == []
    kept = [p for p in (tmp_path / "review").rglob("*") if p.is_file() and p.suffix in (".jpeg", ".jpg")]
    assert [p.read_bytes() for p in kept] == [encode_image(PIXELS, "jpeg", EncodeConfig())[0]]


def test_a_task_cancelled_while_its_image_is_checked_is_not_stored(tmp_path, encoded):
    class CancelDuringCheck(WaitingImageCheck):
        def check(self, images):
            if images[0].shape == PIXELS.shape:
                ledger.mark_cancelled([task.id])
            return super().check(images)

    post, ledger = make(tmp_path, CancelDuringCheck(encoded))
    task = held_task(ledger)
    result = post.submit(task, Generated(Picture(PIXELS), [])).result(30)
    post.shutdown()
    assert result.code == ErrorCode.CANCELLED and stored(tmp_path / "out") == []
