"""Rank 0's gate before the GPU, called by the intake for each leased task:

    validate -> default seed -> fits the context-parallel split -> text check -> its adapters fetched
    -> report `processing`

for the tasks of a lease call together: their prompts go to the text check in one call (a burst costs
one model call, not one per prompt), and the `processing` reports of those that pass go in one call
(POST /v1/reports). A task that does not pass is failed and reported here with its reason (or
dropped, when its lease is gone) and never reaches a round. Runs on the intake thread, while the
current round generates.

A task whose adapters are not all in the node's cache is fetched on a pool of `lora.fetches`
threads and joins the ready tasks when its files are there (`on_ready`, the intake's): a download
that takes a minute holds that task alone, never the others of its lease or the next leases.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from protocol import ErrorCode
from safety.guard import Guard
from safety.verdicts import CheckFailed, Verdict
from worker.adapters import AdapterCache
from worker.config import LimitsConfig, LoraConfig
from worker.model.job import Job
from worker.model.parallel import sequence_fits
from worker.serving.fetches import Fetches
from worker.serving.ledger import Counter, Ledger, Stage
from worker.serving.reporter import Reporter
from worker.serving.swapping import Models
from worker.serving.task import Task
from worker.serving.validation import InvalidRequest, validate_task

log = logging.getLogger(__name__)


def default_seed(task_id: str) -> int:
    """The seed of a task that names none: derived from the task id, so every attempt of a task
    draws the same image (up to kernel rounding, which varies with batch size and threads).
    32 bits fit every common RNG; clients may send seeds up to 2**63 - 1."""
    return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:4], "big")


@dataclass
class Admission:
    limits: LimitsConfig
    guard: Guard
    reporter: Reporter
    ledger: Ledger
    context_ranks: int = 0  # context parallelism splits each image's sequence over this many ranks
    text_tokens: int = 0  # the text's share of that sequence (model.max_sequence_length)
    models: Models | None = None  # several models: which it serves; None: the one it loaded
    # Several models: the limits and text length of each whose differ from the worker's.
    model_limits: Mapping[str, LimitsConfig] = field(default_factory=dict)
    model_text_tokens: Mapping[str, int] = field(default_factory=dict)
    lora: LoraConfig = field(default_factory=LoraConfig)  # which adapters a task may bring
    adapters: AdapterCache | None = None  # the node's adapter files (rank 0 fetches them here)
    on_ready: Callable[[list[Task]], None] | None = None  # tasks admitted once their adapters were fetched

    def __post_init__(self) -> None:
        self.fetches = Fetches(self.adapters, self.lora.fetches, self.reporter, self.ledger) if self.adapters else None

    def admit(self, tasks: list[Task]) -> list[Task]:
        """The tasks of one lease call that may be generated now (their jobs set): each screened,
        then `processing` for all of them in one call. The others were failed and reported, or
        dropped, or are being fetched (`on_ready` gets them)."""
        screened = self._screen([task for task in tasks if self._valid(task)])
        if self.fetches is not None:
            for task in [t for t in screened if not self.fetches.cached(t)]:
                screened.remove(task)
                self.fetches.fetch(task, lambda one: self._processing(self.fetches.with_adapters(one)), self.on_ready)
        return self._processing(self.fetches.with_adapters(screened) if self.fetches else screened)

    def pending(self) -> int:
        """Tasks admitted but for their adapters' download: the intake counts them as ready."""
        return self.fetches.pending() if self.fetches else 0

    def _processing(self, screened: list[Task]) -> list[Task]:
        """`processing` for all of them in one call; those that may run."""
        if not screened:
            return []
        t0 = time.perf_counter()
        admitted = self.reporter.processing_all(screened)
        for task in screened:
            task.timings.record(admit=(time.perf_counter() - t0) * 1e3)
        for task in admitted:
            # Waiting for a round: a serve loop that takes none for stall_s is stuck (the watchdog exits).
            self.ledger.advance(task, Stage.READY)
        return admitted

    def _valid(self, task: Task) -> bool:
        """Held from now on, and its job set; False: the task was failed and reported."""
        self.ledger.hold(task, Stage.ADMIT)  # from now on the heartbeat renews it
        if self.models and (why := self.models.refusal(task.lease.model or self.models.first)):
            # Another worker may hold or load it: retryable.
            self.reporter.fail(task, ErrorCode.MODEL_UNAVAILABLE, why, retryable=True)
            return False
        try:
            task.job = self._validate(task)
        except InvalidRequest as e:
            self.reporter.fail(task, ErrorCode.INVALID_REQUEST, str(e), retryable=False)
            return False
        return True

    def _screen(self, tasks: list[Task]) -> list[Task]:
        """The text check on their prompts together; those refused or unchecked were failed and reported."""
        if not tasks:
            return []
        t0 = time.perf_counter()
        outcomes = self.guard.screen_prompts([task.job.prompt for task in tasks])
        checked_ms = (time.perf_counter() - t0) * 1e3
        passed = []
        for task, outcome in zip(tasks, outcomes):
            task.timings.record(text_check=checked_ms)  # the batch's time, like the other shared stages
            if (refusal := self._refusal(outcome)) is None:
                passed.append(task)
                continue
            code, message, retryable, details = refusal  # reported once the check's time is recorded
            self.reporter.fail(task, code, message, retryable=retryable, details=details)
        return passed

    def _validate(self, task: Task) -> Job:
        model = (task.lease.model or self.models.first) if self.models else None
        job = validate_task(task.id, task.lease.input, self.model_limits.get(model, self.limits), self.lora)
        if job.seed is None:
            job = job.model_copy(update={"seed": default_seed(job.task_id)})
        if model:
            job = job.model_copy(update={"model": model})
        if self.context_ranks:
            tokens = self.model_text_tokens.get(model, self.text_tokens)
            if why := sequence_fits(job.width, job.height, tokens, self.context_ranks):
                raise InvalidRequest(why)
        return job

    def _refusal(self, outcome: Verdict | None | CheckFailed) -> tuple[ErrorCode, str, bool, dict | None] | None:
        """None when the prompt may run, else the failure (code, message, retryable, details).
        A refusal is final; a failing check is retryable."""
        if isinstance(outcome, CheckFailed):
            return ErrorCode.SAFETY_CHECK_FAILED, str(outcome), True, None
        if outcome is None or not outcome.refused:
            return None
        self.ledger.counters.add(Counter.PROMPTS_REFUSED)
        return ErrorCode.UNSAFE_PROMPT, f"prompt refused: {outcome.describe()}", False, outcome.details()
