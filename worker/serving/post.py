"""After generation, on rank 0, off the GPU's critical path: quality check -> image check -> store,
with the encoder working on the same pixels while the checks run (neither waits for the other: on
an idle worker the two are the latency rank 0 adds). Runs in a bounded pool while the next round
generates; each task ends with a PostResult: a result, an error, or nothing (the ledger says it is
dropped), reported in lease order (backlog).

Nothing is stored unless both checks passed (or were switched off by config), and nothing ends as a
result without a stored, verified object. An image the checks refuse is encoded for nothing, or for
quarantine.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from protocol import ErrorCode, ErrorEnvelope, TaskResult
from safety.guard import Guard
from safety.verdicts import CheckFailed
from worker.config import EncodeConfig
from worker.model.job import Job
from worker.ranks.lockstep import Generated
from worker.serving.ledger import Counter, Ledger, Stage
from worker.serving.results import PostResult, failure
from worker.serving.state import WorkerState
from worker.serving.task import Task
from worker.storage import Artifact, ImageStore, ObjectConflict, StorageUnavailable, UploadCorrupted
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

    def submit(self, task: Task, out: Generated) -> Future:
        """A Future of the task's PostResult."""
        return self._pool.submit(self.run, task, out)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._encoder.shutdown(wait=False, cancel_futures=True)

    def run(self, task: Task, out: Generated) -> PostResult:
        self.ledger.advance(task, Stage.CHECK)
        encoded = self._encoder.submit(self._encode, task, out.picture.pixels)
        with task.timings.stage("image_check"):
            refusal = self._check(task.job, out, encoded)
        if refusal is None and self.ledger.cancelled(task):  # never stored
            refusal = failure(ErrorCode.CANCELLED, "cancelled by a client; the image was discarded before "
                              "storing", retryable=False)
        if refusal is not None:
            encoded.cancel()  # when it has not started yet
            return self._done(task, refusal)
        if self.ledger.dropped(task):  # a newer attempt owns the task and its object, or it ran out of time
            encoded.cancel()
            log.warning("task %s: lease lost or deadline passed; result discarded", task.id,
                        extra=task.fields(stage="check"))
            return None
        return self._done(task, self._stored(task, out, encoded))

    def _encode(self, task: Task, pixels: np.ndarray) -> tuple[bytes, str]:
        with task.timings.stage("encode"):
            return encode_image(pixels, task.job.output_format, self.encode)

    def _done(self, task: Task, result: PostResult) -> PostResult:
        self.ledger.advance(task, Stage.REPORT)  # reported in lease order
        return result

    def _check(self, job: Job, out: Generated, encoded: Future) -> ErrorEnvelope | None:
        """Quality, then content. None when the image may be stored."""
        pixels = out.picture.pixels
        quality = self.guard.inspect(pixels, out.picture.nonfinite)
        if not quality.ok:
            self.ledger.counters.add(Counter.CORRUPT_OUTPUTS)
            return failure(ErrorCode.CORRUPT_OUTPUT, quality.reason, retryable=True)
        try:
            verdict = self.guard.screen_image(pixels)
        except CheckFailed as e:
            return failure(ErrorCode.SAFETY_CHECK_FAILED, str(e), retryable=True)
        if verdict is None or not verdict.refused:
            return None
        self.ledger.counters.add(Counter.IMAGES_REFUSED)
        self._keep_for_review(job, encoded)
        return failure(ErrorCode.UNSAFE_IMAGE, f"image refused: {verdict.describe()}", retryable=False,
                       details=verdict.details())

    def _keep_for_review(self, job: Job, encoded: Future) -> None:
        """Puts a flagged image in quarantine, never in the results location. Best effort: the task
        fails as unsafe_image either way."""
        if self.quarantine is None:
            return
        try:
            data, content_type = encoded.result()
            obj = self.quarantine.put(Artifact(job.task_id, data, content_type, time.time(), self._metadata(job)))
            log.warning("task %s: flagged image quarantined at %s", job.task_id, obj.uri)
        except Exception:
            log.exception("task %s: could not quarantine the flagged image", job.task_id)

    def _stored(self, task: Task, out: Generated, encoded: Future) -> PostResult:
        job = task.job
        self.ledger.advance(task, Stage.ENCODE)
        data, content_type = encoded.result()  # usually done by now: it ran beside the checks
        self.ledger.advance(task, Stage.STORE)
        try:
            with task.timings.stage("store"):
                obj = self.store.put(Artifact(job.task_id, data, content_type, task.lease.created_at,
                                               self._metadata(job)))
        except StorageUnavailable as e:
            self.state.storage_outcome(False)
            return failure(ErrorCode.STORAGE_UNAVAILABLE, str(e), retryable=True)
        except ObjectConflict as e:  # another task's object under this task's name: a retry cannot fix it
            return failure(ErrorCode.STORAGE_CONFLICT, str(e), retryable=False)
        except UploadCorrupted as e:
            return failure(ErrorCode.STORAGE_FAILED, str(e), retryable=True)
        except Exception as e:
            log.exception("task %s: storing failed", job.task_id)
            return failure(ErrorCode.STORAGE_FAILED, f"{type(e).__name__}: {e}", retryable=True)
        self.state.storage_outcome(True)
        # The stored object's size and hash: an earlier attempt's, when it stored the object first.
        return TaskResult(uri=obj.uri, url=obj.url, content_type=content_type, width=job.width,
                          height=job.height, seed=job.seed, bytes=obj.bytes, sha256=obj.sha256,
                          timings_ms=task.timings.as_dict(), batch_size=out.batch_size, rank=out.rank,
                          model=job.model or self.model_name)

    def discard(self, task: Task, result: TaskResult) -> None:
        """Removes a stored result the scheduler refused because a client cancelled the task
        meanwhile. Best effort: a failure is logged (the object is the task's own, under its name)."""
        try:
            self.store.remove(result.uri)
            log.info("task %s: cancelled after storing; %s removed", task.id, result.uri, extra=task.fields())
        except Exception:
            log.exception("task %s: could not remove %s after its cancellation", task.id, result.uri)

    def _metadata(self, job: Job) -> dict[str, str]:
        return object_metadata(job, self.model_name, self.include_prompt)


def object_metadata(job: Job, model_name: str, include_prompt: bool) -> dict[str, str]:
    """What a stored object says of the job that made it: the prompt's hash always, the prompt only
    when the config allows."""
    meta = {"task_id": job.task_id, "seed": str(job.seed), "model": job.model or model_name,
            "width": str(job.width), "height": str(job.height), "steps": str(job.steps),
            "prompt_sha256": hashlib.sha256(job.prompt.encode()).hexdigest()}
    if include_prompt:
        meta["prompt"] = job.prompt
    return meta
