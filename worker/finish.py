"""After generation, on rank 0, off the GPU's critical path: quality check -> image check -> encode
-> store. Runs in the serve loop's bounded pool while the next image generates; returns what to
report, and the serve loop reports in lease order.

Nothing is stored unless both checks passed (or were switched off by config), and nothing is
reported as succeeded without a stored, verified object.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

from safety.guard import Guard
from safety.verdicts import CheckFailed
from scheduler.protocol import ErrorEnvelope, Lease, TaskResult
from worker.config import WorkerConfig
from worker.encode import encode_image
from worker.heartbeat import WorkerState
from worker.lockstep import Outcome
from worker.storage import Artifact, ObjectConflict, StorageUnavailable, Store
from worker.validation import Job

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Done:
    """A finished task: a result, an error, or neither (the lease was lost: report nothing)."""

    result: TaskResult | None = None
    error: ErrorEnvelope | None = None


def failure(code: str, message: str, *, retryable: bool, details: dict | None = None) -> Done:
    """The serve loop logs it with the task id and adds its worker id when it reports."""
    return Done(error=ErrorEnvelope(code=code, message=message[:4000], retryable=retryable, details=details))


class Finisher:
    def __init__(self, cfg: WorkerConfig, guard: Guard, store: Store, quarantine: Store | None,
                 state: WorkerState) -> None:
        self.cfg = cfg
        self.guard = guard
        self.store = store
        self.quarantine = quarantine
        self.state = state
        gcs = cfg.storage.gcs
        self._include_prompt = bool(gcs and gcs.include_prompt)

    def run(self, lease: Lease, job: Job, out: Outcome) -> Done:
        # Wall times in ms of each stage this task went through; a batch's stages are shared by
        # its tasks, so each reports the batch's time and its batch_size.
        timings = {**out.timings, "generate": out.seconds * 1e3}
        t0 = time.perf_counter()
        refusal = self._check(job, out)
        timings["image_check"] = (time.perf_counter() - t0) * 1e3
        if refusal is not None:
            return refusal
        if self.state.is_lost(job.task_id):  # a newer attempt owns the task and its object
            log.warning("task %s: lease lost; result discarded", job.task_id)
            return Done()
        return self._store(lease, job, out.image, timings, out.batch_size, out.rank)

    def _check(self, job: Job, out: Outcome) -> Done | None:
        """Quality, then content. None when the image may be stored."""
        quality = self.guard.inspect(out.image, out.nonfinite)
        if not quality.ok:
            self.state.count("corrupt_outputs")
            return failure("corrupt_output", quality.reason, retryable=True)
        try:
            verdict = self.guard.screen_image(out.image)
        except CheckFailed as e:
            return failure("safety_check_failed", str(e), retryable=True)
        if verdict is None or not verdict.refused:
            return None
        self.state.count("images_refused")
        self._quarantine(job, out.image)
        return failure("unsafe_image", f"image refused: {verdict.describe()}", retryable=False,
                       details=verdict.details())

    def _quarantine(self, job: Job, pixels) -> None:
        """Keeps a flagged image for review, never in the results location. Best effort: the task
        fails as unsafe_image either way."""
        if self.quarantine is None:
            return
        try:
            data, content_type = encode_image(pixels, job.output_format, self.cfg.encode)
            obj = self.quarantine.put(Artifact(job.task_id, data, content_type, time.time(), self._metadata(job)))
            log.warning("task %s: flagged image quarantined at %s", job.task_id, obj.uri)
        except Exception:
            log.exception("task %s: could not quarantine the flagged image", job.task_id)

    def _store(self, lease: Lease, job: Job, pixels, timings: dict[str, float], batch_size: int,
               rank: int) -> Done:
        t0 = time.perf_counter()
        data, content_type = encode_image(pixels, job.output_format, self.cfg.encode)
        t1 = time.perf_counter()
        try:
            obj = self.store.put(Artifact(job.task_id, data, content_type, lease.created_at, self._metadata(job)))
        except StorageUnavailable as e:
            return failure("storage_unavailable", str(e), retryable=True)
        except ObjectConflict as e:  # other bytes under this task's name: a retry cannot fix it
            return failure("storage_conflict", str(e), retryable=False)
        except Exception as e:
            log.exception("task %s: storing failed", job.task_id)
            return failure("storage_failed", f"{type(e).__name__}: {e}", retryable=True)
        timings.update(encode=(t1 - t0) * 1e3, store=(time.perf_counter() - t1) * 1e3)
        return Done(result=TaskResult(
            uri=obj.uri, url=obj.url, content_type=content_type, width=job.width, height=job.height,
            seed=job.seed, bytes=obj.bytes, sha256=obj.sha256, timings_ms=timings, batch_size=batch_size,
            rank=rank))

    def _metadata(self, job: Job) -> dict[str, str]:
        meta = {"task_id": job.task_id, "seed": str(job.seed), "model": self.cfg.model.name,
                "width": str(job.width), "height": str(job.height), "steps": str(job.steps),
                "prompt_sha256": hashlib.sha256(job.prompt.encode()).hexdigest()}
        if self._include_prompt:
            meta["prompt"] = job.prompt
        return meta
