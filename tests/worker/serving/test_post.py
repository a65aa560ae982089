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


def held_task(ledger: Ledger, fmt: str = "jpeg", images: int = 1) -> Task:
    task = Task(Lease(task_id="t-1", input={}, created_at=0.0, lease_token="tok", lease_deadline=0.0,
                      lease_ttl_s=60.0, attempt=1))
    task.job = Job(task_id="t-1", prompt="p", width=96, height=64, steps=4, seed=1, output_format=fmt,
                   num_images=images)
    ledger.hold(task, Stage.ADMIT)
    ledger.advance(task, Stage.GENERATE)
    return task


def stored(root) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_the_encoder_runs_while_the_image_check_looks_and_the_image_is_stored(tmp_path, encoded):
    check = WaitingImageCheck(encoded)
    post, ledger = make(tmp_path, check)
    task = held_task(ledger, "png")
    result = post.submit(task, Generated([Picture(PIXELS)], [])).result(30)
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
    result = post.submit(task, Generated([Picture(PIXELS)], [])).result(30)
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
    result = post.submit(task, Generated([Picture(PIXELS)], [])).result(30)
    post.shutdown()
    assert result.code == ErrorCode.CANCELLED and stored(tmp_path / "out") == []


class RefusesMarked:
    """Refuses the images whose first pixel is 255 (the guard's self-test image is grey)."""

    name = "marked"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def check(self, images):
        self.calls.append(len(images))
        return [Verdict(bool(i[0, 0, 0] == 255), self.name, {"nsfw": 1.0}, "nsfw", 1.0) for i in images]


def pictures(refused: set[int], n: int) -> list[Picture]:
    out = []
    for i in range(n):
        pixels = np.random.default_rng(i).integers(0, 255, (64, 96, 3), dtype=np.uint8)
        pixels[0, 0, 0] = 255 if i in refused else 0
        out.append(Picture(pixels))
    return out


def test_a_task_of_several_images_stores_each_and_withholds_the_refused_one(tmp_path):
    check = RefusesMarked()
    post, ledger = make(tmp_path, check, quarantine=True)
    task = held_task(ledger, "png", images=3)
    result = post.submit(task, Generated(pictures({0}, 3), [])).result(30)
    post.shutdown()
    assert check.calls[-1] == 3  # the three images in one call of the check
    assert isinstance(result, TaskResult)
    assert [(i.index, i.seed, i.withheld is None) for i in result.images] == [(0, 1, False), (1, 2, True), (2, 3, True)]
    withheld = result.images[0].withheld
    assert withheld.code == ErrorCode.UNSAFE_IMAGE and not withheld.retryable and withheld.details
    # The top level describes the first image stored: old clients see one good image.
    assert (result.uri, result.seed, result.sha256) == (result.images[1].uri, 2, result.images[1].sha256)
    assert stored(tmp_path / "out") == ["t-1~1.png", "t-1~2.png"]
    assert stored(tmp_path / "review") == ["t-1.png"]
    for image, n in zip(result.images[1:], (1, 2)):
        assert (tmp_path / "out" / f"t-1~{n}.png").read_bytes() == encode_image(
            pictures(set(), 3)[n].pixels, "png", EncodeConfig())[0]
        assert image.bytes == (tmp_path / "out" / f"t-1~{n}.png").stat().st_size


def test_a_task_whose_every_image_is_refused_fails_unsafe_image_and_stores_none(tmp_path):
    post, ledger = make(tmp_path, RefusesMarked())
    task = held_task(ledger, images=2)
    result = post.submit(task, Generated(pictures({0, 1}, 2), [])).result(30)
    post.shutdown()
    assert result.code == ErrorCode.UNSAFE_IMAGE and not result.retryable
    assert result.message.startswith("all 2 images refused; the first: image refused:") and result.details
    assert stored(tmp_path / "out") == []


def test_one_corrupt_image_fails_the_task_retryable_and_stores_none(tmp_path):
    post, ledger = make(tmp_path, RefusesMarked())
    task = held_task(ledger, images=2)
    flat = Picture(np.zeros((64, 96, 3), np.uint8))  # a constant image: the quality check's corrupt output
    result = post.submit(task, Generated([pictures(set(), 1)[0], flat], [])).result(30)
    post.shutdown()
    assert result.code == ErrorCode.CORRUPT_OUTPUT and result.retryable
    assert stored(tmp_path / "out") == []


def test_a_retry_finds_the_images_an_earlier_attempt_stored(tmp_path):
    post, ledger = make(tmp_path, RefusesMarked())
    first = post.submit(held_task(ledger, images=2), Generated(pictures(set(), 2), [])).result(30)
    again = post.submit(held_task(ledger, images=2), Generated(pictures({5}, 2), [])).result(30)
    post.shutdown()
    assert [i.uri for i in again.images] == [i.uri for i in first.images]
    assert [i.sha256 for i in again.images] == [i.sha256 for i in first.images]
    assert stored(tmp_path / "out") == ["t-1.jpg", "t-1~1.jpg"]
