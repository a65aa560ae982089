"""`make bench-fleet`'s simulated worker speaking the exchange (POST /v1/workers/{wid}/exchange), as
the dit-worker does with `queue.exchange` (worker.serving.exchange): its GPUs run tasks from a lease-
ahead queue of two rounds; a task's `processing` note waits for the next call with its start time;
a result goes at once, carrying the notes and, while a round is still ready, the request for more
tasks (held up to HOLD_S for a result to carry it); with less than a round ready the worker asks at
once, long-polling, and a result that finishes meanwhile goes in a call of its own.

With sets of LoRA adapters (the fleet's `adapters`), each worker holds the sets it ran last (LRU, as
worker.serving.adapter_sets does), says them in its exchanges when the fleet routes, and a task of a
set it does not hold costs `load_s` first (fetch and load)."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import deque
from typing import Protocol

import aiohttp

from protocol import adapter_set_key

RESULT = {"uri": "file:///bench.jpg", "content_type": "image/jpeg", "width": 16, "height": 16, "seed": 1,
          "bytes": 1, "sha256": "0"}
class Fleet(Protocol):
    """What a worker needs of bench.fleet.Fleet: its record, its stop event, its shape and task time,
    and how it holds adapters."""

    rec: object
    stop: asyncio.Event
    width: int
    work_s: float
    adapters: "AdapterPlan | None"


class AdapterPlan(Protocol):
    held: int  # sets a worker keeps loaded
    load_s: float  # fetch and load a set it does not hold
    say: bool  # exchanges say the sets held (routing); False: the scheduler is told nothing


HOLD_S = 2.0  # queue.lease_hold_s's default
WAIT_S = 10.0  # queue.lease_wait_s's default


class ExchangeWorker:
    def __init__(self, fleet: Fleet, http: aiohttp.ClientSession, side: aiohttp.ClientSession, url: str,
                 wid: str) -> None:
        self.fleet, self.http, self.side, self.url, self.wid = fleet, http, side, url, wid
        self.width = fleet.width
        self.ready: deque[dict] = deque()
        self.held: dict[str, dict] = {}  # leased, not yet reported final: what heartbeats list
        self.notes: list[dict] = []
        self.finals: list[dict] = []
        self.polling = False  # a long poll is under way: a result goes in a call of its own
        self.wake = asyncio.Event()  # a result is ready, or a GPU took the last ready round
        self.free = asyncio.Semaphore(0)  # ready tasks, for the GPUs
        self.side_calls: set[asyncio.Task] = set()
        self.sets: list[str] = []  # the sets of adapters held, most recently used last

    async def run(self) -> None:
        gpus = [asyncio.create_task(self._gpu()) for _ in range(self.width)]
        try:
            while not self.fleet.stop.is_set():
                await self._turn()
        finally:
            for t in [*gpus, *self.side_calls]:
                t.cancel()

    async def _turn(self) -> None:
        hungry = len(self.ready) < self.width
        want = max(0, 2 * self.width - len(self.ready))
        if not hungry and not self.finals:
            try:  # a round is ready: hold the request for a result to carry it
                await asyncio.wait_for(self.wake.wait(), HOLD_S)
            except TimeoutError:
                pass
            self.wake.clear()
            if not self.finals and len(self.ready) >= self.width:
                want = max(0, 2 * self.width - len(self.ready))
                if not want and not self.notes:
                    return
        finals, self.finals = self.finals, []
        wait_s = WAIT_S if hungry and not finals else 0.0
        self.polling = wait_s > 0
        try:
            await self._exchange(self.http, finals, want, wait_s)
        finally:
            self.polling = False

    async def _exchange(self, http: aiohttp.ClientSession, finals: list[dict], want: int, wait_s: float) -> None:
        notes, self.notes = (self.notes, []) if http is self.http else ([], self.notes)
        mine = {"worker_id": self.wid}
        reports = [{**mine, "task_id": le["task_id"], "lease_token": le["lease_token"], "status": "processing",
                    "at": at} for le, at in notes]
        reports += [{**mine, "task_id": le["task_id"], "lease_token": le["lease_token"], "status": "succeeded",
                     "result": RESULT} for le in finals]
        final_ids = {le["task_id"] for le in finals}
        t = time.perf_counter()
        body = {"exchange_id": uuid.uuid4().hex, "reports": reports, "max_tasks": want, "wait_s": wait_s,
                "held": [i for i in self.held if i not in final_ids]}
        if (plan := self.fleet.adapters) is not None and plan.say and self.sets:
            body["adapters"] = list(self.sets)
        answer = await self._post(http, body)
        now = time.perf_counter()
        rec = self.fleet.rec
        done = [res["task_id"] for res in answer["results"][len(notes):] if res.get("status_code") == 200]
        rec.succeeded.update((tid, now) for tid in done)
        for tid in final_ids:
            self.held.pop(tid, None)
        got = answer["leases"]
        if got:
            known = [rec.sent_at[le["task_id"]] for le in got if le["task_id"] in rec.sent_at]
            ready = min((acc for _, acc in known), default=t)
            rec.leases.append(((now - max(t, ready)) * 1e3, len(got)))
            rec.waits.extend((sent, now - sent) for sent, _ in known)
        for le in got:
            self.held[le["task_id"]] = le
            self.notes.append((le, time.time()))  # admitted: its start goes with the next call
            self.ready.append(le)
            self.free.release()

    async def _post(self, http: aiohttp.ClientSession, body: dict) -> dict:
        """The exchange, tried again as the same exchange (marked a retry) after a reset connection,
        as the worker's client does; nothing got after three tries."""
        for attempt in range(3):
            self.fleet.rec.worker_calls += 1
            try:
                async with http.post(f"{self.url}/v1/workers/{self.wid}/exchange",
                                     json={**body, "retry": attempt > 0}) as r:
                    return await r.json() if r.status == 200 else {"results": [], "leases": []}
            except aiohttp.ClientError as e:
                self.fleet.rec.errors.append(f"exchange try {attempt + 1}: {e!r}")
        return {"results": [], "leases": []}

    async def _adapters_for(self, le: dict) -> None:
        """The task's set of adapters loaded (load_s when not held, the least recently used going)."""
        plan = self.fleet.adapters
        if plan is None or not (key := adapter_set_key(le.get("input", {}).get("loras"))):
            return
        rec = self.fleet.rec
        rec.adapter_tasks += 1
        if key not in self.sets:
            rec.adapter_loads += 1
            await asyncio.sleep(plan.load_s)
        self.sets = ([k for k in self.sets if k != key] + [key])[-plan.held:]

    async def _gpu(self) -> None:
        while True:
            await self.free.acquire()
            le = self.ready.popleft()
            if len(self.ready) < self.width:
                self.wake.set()  # hungry now: the held request goes at once
            await self._adapters_for(le)
            await asyncio.sleep(self.fleet.work_s * random.uniform(0.8, 1.2))
            if self.polling:  # the worker's long poll would hold it: a call of its own
                call = asyncio.create_task(self._exchange(self.side, [le], 0, 0.0))
                self.side_calls.add(call)
                call.add_done_callback(self.side_calls.discard)
            else:
                self.finals.append(le)
                self.wake.set()

