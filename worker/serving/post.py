"""After generation, on rank 0, off the GPU's critical path: quality check -> image check -> store,
each image of the task (num_images), with the encoder working on the same pixels while the checks run (neither waits for the other: on
an idle worker the two are the latency rank 0 adds). Runs in a bounded pool while the next round
generates; each task ends with a PostResult: a result, an error, or nothing (the ledger says it is
dropped), reported in lease order (backlog).

Nothing is stored unless both checks passed (or were switched off by config), and nothing ends as a
result without a stored, verified object. An image the image check refuses is withheld (encoded
for nothing, or for quarantine) and marked in the result; the task succeeds with its other images,
and fails `unsafe_image` only when every image is refused. A corrupt image or a check that fails
fails the whole task (retryable): the device or the check is at fault, not the image.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from protocol import AdapterUsed, ErrorCode, ErrorEnvelope, ImageResult, TaskResult
from safety.guard import Guard
from safety.verdicts import CheckFailed
from worker.config import EncodeConfig
from worker.model.job import Job
from worker.ranks.lockstep import Generated
from worker.serving.ledger import Counter, Ledger, Stage
from worker.serving.results import PostResult, failure
from worker.serving.state import WorkerState
from worker.serving.task import Task
from worker.storage import Artifact, ImageStore, ObjectConflict, StorageUnavailable, StoredObject, UploadCorrupted
from worker.storage.encode import encode_image

log = logging.getLogger(__name__)


@dataclass
class PostStage:
    guard: Guard
    store: ImageStore
    quarantine: ImageStore | None  # where flagged images go for review; None: not kept
    state: WorkerState  # told whether storage works (readiness)
    ledger: Ledger
    encode: EncodeConfig
    model_name: str
    include_prompt: bool  # the prompt itself in the object's metadata (always its sha256)
    workers: int  # threads of the pool

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="post")
        # Its own threads: an encode queued behind the post pool's checks would not overlap them.
        self._encoder = ThreadPoolExecutor(self.workers, thread_name_prefix="encode")
        self._checks = ImageChecks(self.guard, self.ledger, self.quarantine, self._metadata)

    def submit(self, task: Task, out: Generated) -> Future:
        """A Future of the task's PostResult."""
        return self._pool.submit(self.run, task, out)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._encoder.shutdown(wait=False, cancel_futures=True)

    def run(self, task: Task, out: Generated) -> PostResult:
        self.ledger.advance(task, Stage.CHECK)
        encoded = [self._encoder.submit(self._encode, task, picture.pixels) for picture in out.pictures]
        with task.timings.stage("image_check"):
            refusal, withheld = self._checks(task.job, out, encoded)
        if refusal is None and self.ledger.cancelled(task):  # never stored
            refusal = failure(ErrorCode.CANCELLED, "cancelled by a client; the image was discarded before "
                              "storing", retryable=False)
        if refusal is not None:
            for future in encoded:
                future.cancel()  # when it has not started yet
            return self._done(task, refusal)
        if self.ledger.dropped(task):  # a newer attempt owns the task and its object, or it ran out of time
            for future in encoded:
                future.cancel()
            log.warning("task %s: lease lost or deadline passed; result discarded", task.id,
                        extra=task.fields(stage="check"))
            return None
        return self._done(task, self._stored(task, out, encoded, withheld))

    def _encode(self, task: Task, pixels: np.ndarray) -> tuple[bytes, str]:
        with task.timings.stage("encode"):  # a task's images: the last one's
            return encode_image(pixels, task.job.output_format, self.encode)

    def _done(self, task: Task, result: PostResult) -> PostResult:
        self.ledger.advance(task, Stage.REPORT)  # reported in lease order
        return result

    def _stored(self, task: Task, out: Generated, encoded: list[Future],
                withheld: dict[int, ErrorEnvelope]) -> PostResult:
        """Every image not withheld, stored in image order; the task's result once all are. A
        failure fails the task (an image stored before it is found again by the retry)."""
        job = task.job
        self.ledger.advance(task, Stage.ENCODE)
        data = {index: future.result() for index, future in enumerate(encoded)  # usually done: beside the checks
                if index not in withheld}
        self.ledger.advance(task, Stage.STORE)
        images: list[ImageResult] = []
        with task.timings.stage("store"):
            for index, seed in enumerate(job.seeds):
                if index in withheld:
                    images.append(ImageResult(index=index, seed=seed, withheld=withheld[index]))
                    continue
                stored = self._put(job, index, *data[index], task.lease.created_at)
                if isinstance(stored, ErrorEnvelope):
                    return stored
                images.append(ImageResult(index=index, seed=seed, uri=stored.uri, url=stored.url,
                                          content_type=data[index][1], bytes=stored.bytes, sha256=stored.sha256))
        self.state.storage_outcome(True)
        first = next(image for image in images if image.withheld is None)
        # The stored object's size and hash: an earlier attempt's, when it stored the object first.
        return TaskResult(uri=first.uri, url=first.url, content_type=first.content_type, width=job.width,
                          height=job.height, seed=first.seed, bytes=first.bytes, sha256=first.sha256,
                          timings_ms=task.timings.as_dict(), batch_size=out.batch_size, rank=out.rank,
                          model=job.model or self.model_name, images=images,
                          loras=[AdapterUsed(source=r.source, scale=r.scale, sha256=r.sha256) for r in job.loras])

    def _put(self, job: Job, index: int, data: bytes, content_type: str, created_at: float) -> StoredObject | ErrorEnvelope:
        try:
            return self.store.put(Artifact(job.task_id, data, content_type, created_at, self._metadata(job, index),
                                           index))
        except StorageUnavailable as e:
            self.state.storage_outcome(False)
            return failure(ErrorCode.STORAGE_UNAVAILABLE, str(e), retryable=True)
        except ObjectConflict as e:  # another task's object under this task's name: a retry cannot fix it
            return failure(ErrorCode.STORAGE_CONFLICT, str(e), retryable=False)
        except UploadCorrupted as e:
            return failure(ErrorCode.STORAGE_FAILED, str(e), retryable=True)
        except Exception as e:
            log.exception("task %s: storing image %d failed", job.task_id, index)
            return failure(ErrorCode.STORAGE_FAILED, f"{type(e).__name__}: {e}", retryable=True)

    def discard(self, task: Task, result: TaskResult) -> None:
        """Removes a stored result the scheduler refused because a client cancelled the task
        meanwhile. Best effort: a failure is logged (the object is the task's own, under its name)."""
        try:
            self.store.remove(result.uri)
            log.info("task %s: cancelled after storing; %s removed", task.id, result.uri, extra=task.fields())
        except Exception:
            log.exception("task %s: could not remove %s after its cancellation", task.id, result.uri)

    def _metadata(self, job: Job, index: int = 0) -> dict[str, str]:
        return object_metadata(job, self.model_name, self.include_prompt, index)


@dataclass
class ImageChecks:
    """A task's images through the quality check, then the image check (all of them in one call of
    it); a refused one is withheld, and kept for review where the config says."""

    guard: Guard
    ledger: Ledger
    quarantine: ImageStore | None  # where flagged images go for review; None: not kept
    metadata: Callable[[Job, int], dict[str, str]]  # what a stored object says of its job and image

    def __call__(self, job: Job, out: Generated, encoded: list[Future]) -> tuple[ErrorEnvelope | None,
                                                                                 dict[int, ErrorEnvelope]]:
        """Quality, then content, each image. (None, the images withheld) when the others may be
        stored; (why, ...) when the task fails: an image corrupt or a check that failed (retryable),
        or every image refused."""
        for picture in out.pictures:
            quality = self.guard.inspect(picture.pixels, picture.nonfinite)
            if not quality.ok:
                self.ledger.counters.add(Counter.CORRUPT_OUTPUTS)
                return failure(ErrorCode.CORRUPT_OUTPUT, quality.reason, retryable=True), {}
        try:
            verdicts = self.guard.screen_images([picture.pixels for picture in out.pictures])
        except CheckFailed as e:
            return failure(ErrorCode.SAFETY_CHECK_FAILED, str(e), retryable=True), {}
        withheld = {}
        for index, verdict in enumerate(verdicts):
            if verdict is not None and verdict.refused:
                self.ledger.counters.add(Counter.IMAGES_REFUSED)
                self._keep_for_review(job, index, encoded[index])
                withheld[index] = failure(ErrorCode.UNSAFE_IMAGE, f"image refused: {verdict.describe()}",
                                          retryable=False, details=verdict.details())
        if len(withheld) < len(verdicts):
            return None, withheld
        if len(withheld) == 1:
            return withheld[0], withheld
        first = withheld[0]
        return failure(ErrorCode.UNSAFE_IMAGE, f"all {len(withheld)} images refused; the first: {first.message}",
                       retryable=False, details=first.details), withheld

    def _keep_for_review(self, job: Job, index: int, encoded: Future) -> None:
        """Puts a flagged image in quarantine, never in the results location. Best effort: the image
        is withheld either way."""
        if self.quarantine is None:
            return
        try:
            data, content_type = encoded.result()
            obj = self.quarantine.put(Artifact(job.task_id, data, content_type, time.time(), self.metadata(job, index),
                                               index))
            log.warning("task %s: flagged image %d quarantined at %s", job.task_id, index, obj.uri)
        except Exception:
            log.exception("task %s: could not quarantine flagged image %d", job.task_id, index)


def object_metadata(job: Job, model_name: str, include_prompt: bool, index: int = 0) -> dict[str, str]:
    """What a stored object says of the job and the image that made it: the prompt's hash always,
    the prompt only when the config allows."""
    meta = {"task_id": job.task_id, "seed": str(job.seeds[index]), "model": job.model or model_name,
            "width": str(job.width), "height": str(job.height), "steps": str(job.steps),
            "prompt_sha256": hashlib.sha256(job.prompt.encode()).hexdigest()}
    if job.num_images > 1:
        meta["image"] = f"{index} of {job.num_images}"
    if job.loras:
        meta["loras"] = ",".join(f"{ref.sha256}:{ref.scale:g}" for ref in job.loras)
    if include_prompt:
        meta["prompt"] = job.prompt
    return meta
