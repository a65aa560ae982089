"""The checks a submission passes before anything is stored: its webhooks' hosts are allowed, some
live worker can serve its input, the queue has room, and its client is under its rate."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator

from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool

from protocol import SubmitTask
from scheduler import servable
from scheduler.api.cache import Cached
from scheduler.config import ApiConfig
from scheduler.end_rate import ahead, queue_wait_s
from scheduler.limits import RateLimit, client_key, retry_after_s
from scheduler.metrics import SchedulerMetrics
from scheduler.store import Store
from scheduler.webhooks import refusal

class QueueLoad:
    """What a submission is weighed against, without a query per submit (a COUNT per submit grows
    with the backlog): the queued tasks per priority and the end rate, read together at most every
    `max_age_s` off the event loop, plus the tasks this process admitted since. Another scheduler
    process's admissions show at the next read."""

    def __init__(self, store: Store, max_age_s: float) -> None:
        self._store = store
        self._max_age_s = max_age_s
        self._lock = asyncio.Lock()
        self._at = float("-inf")
        self._depth: dict[int, int] = {}
        self._rate_read = 0.0
        self._since: Counter[int] = Counter()
        self._taken = 0

    async def read(self) -> tuple[Counter[int], float]:
        """(queued tasks per priority, tasks drained per second)."""
        if time.monotonic() - self._at >= self._max_age_s:  # stale: read (fresh, most submits take no lock)
            async with self._lock:
                if time.monotonic() - self._at >= self._max_age_s:  # not read meanwhile by another
                    # Cleared before the read: a task admitted meanwhile may count twice, never zero times.
                    self._since, self._taken = Counter(), 0
                    self._depth, self._rate_read = await run_in_threadpool(self._load)  # scans: off the event loop
                    self._at = time.monotonic()
        return _less_from_the_top(Counter(self._depth) + self._since, self._taken), self._rate_read

    def admitted(self, tasks: list[SubmitTask]) -> None:
        self._since.update(t.priority for t in tasks)

    def taken(self, n: int) -> None:
        """This process leased n tasks: the queue is shorter (until the next read says exactly)."""
        self._taken += n

    def _load(self) -> tuple[dict[int, int], float]:
        return self._store.tasks.queued_by_priority(), self._store.tasks.end_rate()


class StandingQueue:
    """Whether this process keeps up with its submits: CoDel's test for a standing queue (Nichols
    and Jacobson, "Controlling Queue Delay", 2012). A burst drains within an interval, so some
    submit in it is fast; when even the fastest submit taken in during the last interval took longer
    than `target_s`, and there was a queue (at least MIN_QUEUE in flight at once: one slow client
    alone is not a queue), the process is behind for the next interval. An interval in which none
    ended while a queue was in flight is behind too once the oldest in flight has waited longer than
    `target_s`: a pause shorter than that (a garbage collection, a checkpoint) is not a queue.

    Behind, it does not refuse every submit (that would leave the process idle once those in flight
    are stored): it lets in as many as it stores within `target_s` at the last interval's pace
    (Little's law: in flight = pace x wait), and refuses those beyond, each told to come back at a
    time of its own (`come_back_s`)."""

    INTERVAL_S = 0.1
    MIN_QUEUE = 4
    INTAKE_INTERVALS = 10  # the pace the refused are spread at: what was stored over about the last second

    def __init__(self, target_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.target_s, self.clock = target_s, clock
        self._peak = self._ended = 0
        self._started: dict[int, float] = {}  # submits in flight: when each was taken in
        self._tokens = itertools.count()
        self._room = math.inf  # submits in flight allowed; unbounded while not behind
        self._since = clock()
        self._fastest = math.inf
        self._due = -math.inf  # when the last client refused was told to come back
        self._intake: deque[tuple[float, int]] = deque(maxlen=self.INTAKE_INTERVALS)  # (seconds, stored)

    def behind(self) -> bool:
        """True when a submit now would be one too many."""
        if not self.target_s:
            return False
        if (now := self.clock()) - self._since >= self.INTERVAL_S:
            self._roll(now)
        return self.in_flight >= self._room

    @property
    def room(self) -> float:
        """Submits that may be in flight, as the last interval left it (infinite: not behind)."""
        return self._room

    @property
    def in_flight(self) -> int:
        return len(self._started)

    def come_back_s(self) -> int:
        """Retry-After for a submit refused now, in whole seconds. The refused are spread out at the
        pace the process stored submits over about the last second, at least a second from now.
        One fixed second brought every client refused in a second back together, to be refused
        again, and a process behind spent its time refusing (make bench-fleet --client-retries,
        300 GPUs on 2 cores: 121,411 refusals in 30 s, 40% completed, against 62% when clients
        gave up at the first 429)."""
        now = self.clock()
        due = max(self._due, now + 1.0)
        self._due = due + 1.0 / self.intake_per_s()
        return max(1, math.floor(due - now))

    def intake_per_s(self) -> float:
        """Submits stored per second over about the last second (at least one)."""
        seconds = sum(dt for dt, _ in self._intake)
        return max(sum(n for _, n in self._intake) / seconds, 1.0) if seconds else 1.0

    def _roll(self, now: float) -> None:
        self._intake.append((now - self._since, self._ended))
        if self._ended:
            slow = self._fastest > self.target_s
        else:  # none ended: slow once the oldest in flight has waited past the target
            slow = bool(self._started) and now - min(self._started.values()) > self.target_s
        if slow and self._peak >= self.MIN_QUEUE:
            pace = self._ended / max(now - self._since, 1e-6)  # stored per second
            self._room = max(self.MIN_QUEUE, round(pace * self.target_s))
        else:
            self._room = math.inf
        self._fastest, self._peak, self._ended, self._since = math.inf, self.in_flight, 0, now

    def enter(self) -> int:
        """A submit is taken in; its token for `leave`."""
        self._started[token := next(self._tokens)] = self.clock()
        self._peak = max(self._peak, self.in_flight)
        return token

    def leave(self, token: int) -> None:
        """That submit is stored or refused."""
        self._ended += 1
        self._fastest = min(self._fastest, self.clock() - self._started.pop(token))


class SubmitGate:
    """A submission's checks before it is stored, and the load they weigh it against (the module's
    docstring lists them); each refusal is a 4xx naming why, a 429 with its Retry-After."""

    def __init__(self, store: Store, api: ApiConfig, metrics: SchedulerMetrics) -> None:
        self._store = store
        self._api = api
        self._submissions = metrics.submissions
        self.standing = StandingQueue(api.gate.max_submit_s)
        self._rate = RateLimit(api.gate.rate_limit, api.gate.rate_burst or max(1.0, api.gate.rate_limit * 10))
        self.load = QueueLoad(store, api.gate.read_s)
        self._fleet: Cached[list] = Cached([])

    @contextlib.contextmanager
    def taking(self, n: int) -> Iterator[None]:
        """Held while a submit call of n tasks is taken in (checked, then stored); 429 when this
        process is too busy for it (`busy`)."""
        if (refusal := self.busy(n)) is not None:
            raise refusal
        token = self.standing.enter()
        try:
            yield
        finally:
            self.standing.leave(token)

    def busy(self, n: int) -> HTTPException | None:
        """The 429 for a submit call of n tasks while this process is behind (StandingQueue), with a
        Retry-After that spreads the refused over the seconds to come (StandingQueue.come_back_s)."""
        if not self.standing.behind():
            return None
        self._submissions.labels("shed").inc(n)
        after = self.standing.come_back_s()
        return HTTPException(429, "the scheduler is busy: its submits take longer than "
                             f"{self._api.gate.max_submit_s:g}s to be taken in (api.gate.max_submit_s); "
                             f"retry in about {after}s",
                             headers={"Retry-After": str(after)})

    async def check(self, tasks: list[SubmitTask], request: Request) -> None:
        """422 for a model, a webhook or an input refused, 429 (with a Retry-After) for no room or
        over rate. A task that names no model gets the fleet's default here."""
        self._check_models(tasks)
        self._check_webhooks(tasks)
        await self._check_servable(tasks)
        await self._admit(request, tasks)

    def fleet_changed(self) -> None:
        """A worker registered or drains here: the next check reads the fleet's limits afresh."""
        self._fleet = Cached([])

    def _check_models(self, tasks: list[SubmitTask]) -> None:
        """422 naming the field when a task names a model the fleet does not serve (config [models])."""
        models = self._store.models
        for i, task in enumerate(tasks):
            if task.model is None:
                task.model = self._store.default_model
            elif task.model not in models:
                self._submissions.labels("unknown_model").inc(len(tasks))
                raise HTTPException(422, _of(i, tasks, f"model: {task.model!r} is not one of this fleet's models "
                                             f"({', '.join(sorted(models))}; GET /v1/models)" if models else
                                             "model: this fleet serves one model and routes by none (the "
                                             "scheduler's models.ids is empty): leave model out"))

    def _check_webhooks(self, tasks: list[SubmitTask]) -> None:
        """422 naming the host when a task's webhook is not on the operator's allowlist."""
        for i, task in enumerate(tasks):
            if task.webhook is not None and (why := refusal(task.webhook.url, self._api.webhooks.allow)):
                raise HTTPException(422, _of(i, tasks, why))

    async def _check_servable(self, tasks: list[SubmitTask]) -> None:
        """422 naming the field when no live worker's limits allow a task's input: better now than a
        failure once leased. Nothing is refused while no live worker is registered (the fleet may
        start later), nor with --admit-unservable. The fleet's limits are read at most every
        `admission_read_s`, and after a worker registers or drains here."""
        if self._api.gate.admit_unservable:
            return
        fleet = await self._fleet.get(lambda: self._store.acall(self._store.workers.fleet_limits),
                                       self._api.gate.read_s)
        for i, task in enumerate(tasks):
            if why := servable.refusal(task.input, fleet):
                self._submissions.labels("unservable").inc(len(tasks))
                raise HTTPException(422, _of(i, tasks, why))

    async def _admit(self, request: Request, tasks: list[SubmitTask]) -> None:
        """429 with a Retry-After when the queue is full, when a task would wait longer than the
        fleet's end rate allows, or when this client is over its rate."""
        n = len(tasks)
        depth, rate = await self.load.read()
        queued, limit = sum(depth.values()), self._api.gate.max_queued
        if queued + n > limit:
            retry = retry_after_s(queued + n - limit, rate)
            self._refuse(n, f"queue is full ({queued} queued, limit {limit}); at the recent pace there is room in "
                         f"about {retry}s", retry)
        lane = min(t.priority for t in tasks)  # the lowest lane a batch touches waits longest
        bound = self._api.gate.max_queue_wait_s
        if bound and (wait := queue_wait_s(depth, lane, n, rate)) is not None and wait > bound:
            # Retry-After: what the tasks ahead need to drain, the wait a task let in now would have.
            retry = retry_after_s(ahead(depth, lane), rate)
            self._refuse(n, f"a task of priority {lane} would wait about {wait:.0f}s, over the limit of {bound:g}s "
                         f"({ahead(depth, lane)} tasks ahead, tasks end at {rate:.1f}/s); retry in about "
                         f"{retry}s", retry)
        self._check_rate(request, n)
        self.load.admitted(tasks)

    def _refuse(self, n: int, why: str, retry: int) -> None:
        self._submissions.labels("refused").inc(n)
        raise HTTPException(429, why, headers={"Retry-After": str(retry)})

    def _check_rate(self, request: Request, n: int) -> None:
        client = client_key(request.headers.get("authorization"), request.client.host if request.client else None)
        wait = self._rate.take(client, n)
        if wait == math.inf:
            raise HTTPException(422, f"{n} tasks in one call is over this client's burst ({self._rate.burst:g}); "
                                "send fewer per call")
        if wait > 0:
            self._submissions.labels("rate_limited").inc(n)
            raise HTTPException(429, f"rate limit: {self._api.gate.rate_limit:g} tasks/s per client", headers={
                "Retry-After": str(max(1, math.ceil(wait)))})


def _less_from_the_top(depth: Counter[int], n: int) -> Counter[int]:
    """The queue after n tasks were leased: a claim takes the highest priority first."""
    for p in sorted(depth, reverse=True):
        took = min(n, depth[p])
        depth[p] -= took
        n -= took
    return +depth  # lanes emptied are dropped


def _of(i: int, tasks: list[SubmitTask], why: str) -> str:
    """A refusal's detail: which task of a batch it is about."""
    return f"tasks[{i}]: {why}" if len(tasks) > 1 else why
