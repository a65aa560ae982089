"""A fleet's load on a fresh scheduler process, killed and restarted in the middle, on each store.

About a hundred simulated single-GPU workers register, heartbeat, lease and report over HTTP while
clients submit on an open-loop schedule, all starting together (a fleet coming up: registrations,
the first reads and the first groups of a new process in the same turns). Halfway, the scheduler is
SIGKILLed and started again on the same database; the workers whose calls it cut register again at once (as a
restarted node does, by node id, which gives back what their earlier registrations held) and the
clients send what was not answered again with the same idempotency key. Then: every task submitted
ends (succeeded), no call was answered 5xx, no idempotency key made two tasks, no task's success was
accepted twice, and the process exits 0 on SIGTERM within server.shutdown_s.

The rate is about half of what one process takes on two cores with the other tests beside it
(TEST_SIZE=ci runs fewer workers and a lower rate for the same time).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections import Counter

import aiohttp
import pytest

from launch.local import free_port, start_scheduler
from tests.harness import ci_size

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

WORKERS = 60 if ci_size() else 100
RATE = 40.0 if ci_size() else 60.0  # tasks offered per second
LOAD_S = 15.0
KILL_AT_S = 7.0
WORK_S = 0.3  # a task's simulated GPU time
HEARTBEAT_S = 2.0
SHUTDOWN_S = 10.0
SETTLE_S = 60.0  # after the load: every task must have ended by then
REG = {"world_size": 1, "devices": [{"name": "sim", "memory_bytes": 0}], "model": "sim", "version": "stress"}
RESULT = {"uri": "file:///stress.png", "content_type": "image/png", "width": 16, "height": 16, "seed": 1,
          "bytes": 1, "sha256": "0"}
# The scheduler killed or restarting: no connection, no answer in time, or an answer cut off mid-body.
GONE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)


class Fleet:
    def __init__(self, url: str) -> None:
        self.url = url
        self.codes: Counter[int] = Counter()  # every answer's status code
        self.fivexx: list[str] = []
        self.crashed: list[str] = []  # a simulated worker that stopped on an error of its own (a harness bug)
        self.answered: dict[str, str] = {}  # idempotency key -> task id
        self.keys_offered = 0
        self.accepted: Counter[str] = Counter()  # task id -> succeeded reports answered 200
        self.registrations = 0
        self.restarted = False  # set once the second process answers
        self.served_after: set[int] = set()  # workers with a call answered by the second process
        self.stop = asyncio.Event()

    async def call(self, http: aiohttp.ClientSession, method: str, path: str, **kw) -> tuple[int, dict | None]:
        async with http.request(method, self.url + path, **kw) as r:
            body = await r.json() if r.content_type == "application/json" else None
        self.codes[r.status] += 1
        if r.status >= 500:
            self.fivexx.append(f"{method} {path}: {r.status} {body}")
        return r.status, body

    # ------------------------------------------------------------------ workers

    async def register(self, http: aiohttp.ClientSession, node: str) -> str:
        while True:
            try:
                code, body = await self.call(http, "POST", "/v1/workers", json={**REG, "hostname": node, "node_id": node})
                if code == 201:
                    self.registrations += 1
                    return body["worker_id"]
            except GONE:
                pass
            await asyncio.sleep(0.1)

    async def worker(self, n: int) -> None:
        node = f"node-{n}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:
            wid = await self.register(http, node)
            held: list[str] = []
            beat = asyncio.create_task(self.heartbeat(http, lambda: wid, held))
            try:
                while not self.stop.is_set():
                    try:
                        await self.one_task(http, wid, held)
                        if self.restarted:
                            self.served_after.add(n)
                    except GONE:  # the scheduler went away: register again at once, what was held is given back
                        held.clear()
                        wid = await self.register(http, node)
            finally:
                beat.cancel()

    async def one_task(self, http: aiohttp.ClientSession, wid: str, held: list[str]) -> None:
        code, body = await self.call(http, "POST", f"/v1/workers/{wid}/lease", json={"max_tasks": 1, "wait_s": 2.0})
        if code != 200:
            return
        lease = body["leases"][0]
        task, token = lease["task_id"], lease["lease_token"]
        held.append(task)
        report = {"worker_id": wid, "lease_token": token}
        try:
            code, _ = await self.call(http, "POST", f"/v1/tasks/{task}/report", json={**report, "status": "processing"})
            if code != 200:
                return  # stale (the registration was replaced) or cancelled: not ours any more
            await asyncio.sleep(WORK_S * random.uniform(0.8, 1.2))
            code, _ = await self.call(http, "POST", f"/v1/tasks/{task}/report",
                                      json={**report, "status": "succeeded", "result": RESULT})
            if code == 200:
                self.accepted[task] += 1
        finally:
            held.remove(task)

    async def heartbeat(self, http: aiohttp.ClientSession, wid, held: list[str]) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S * random.uniform(0.5, 1.0))
            try:
                await self.call(http, "POST", f"/v1/workers/{wid()}/heartbeat",
                                json={"status": "ready", "in_flight": list(held), "timestamp": time.time()})
            except GONE:
                pass

    # ------------------------------------------------------------------ clients

    async def clients(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:
            start = time.monotonic()
            due, n, pending = start, 0, set()
            while due - start < LOAD_S:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                pending.add(asyncio.create_task(self.submit(http, f"k{n}")))
                n += 1
                due += random.expovariate(RATE)
            self.keys_offered = n
            await asyncio.gather(*pending)

    async def submit(self, http: aiohttp.ClientSession, key: str) -> None:
        """Sent again with the same key until answered, as `dit submit` does."""
        while True:
            try:
                code, body = await self.call(http, "POST", "/v1/tasks",
                                             json={"input": {"prompt": f"stress {key}"}, "idempotency_key": key})
                if code in (200, 201):
                    self.answered[key] = body["id"]
                    return
            except GONE:
                code = 0
            await asyncio.sleep(1.0 if code == 429 else 0.1)


async def load(fleet: Fleet, restart) -> None:
    workers = [asyncio.create_task(fleet.worker(n)) for n in range(WORKERS)]
    clients = asyncio.create_task(fleet.clients())  # with the registrations, not after them
    await asyncio.sleep(KILL_AT_S)
    await asyncio.to_thread(restart)
    await asyncio.wait_for(clients, LOAD_S + SETTLE_S)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        end = time.monotonic() + SETTLE_S
        while time.monotonic() < end and not await all_succeeded(fleet, http):
            await asyncio.sleep(0.5)
    # A worker whose call was open at the kill may come back late (its client's timeout, then a new
    # registration): the fleet runs until every worker has been answered by the new process, or SETTLE_S.
    end = time.monotonic() + SETTLE_S
    while time.monotonic() < end and len(fleet.served_after) < WORKERS:
        await asyncio.sleep(0.2)
    fleet.stop.set()
    for n, outcome in enumerate(await asyncio.gather(*workers, return_exceptions=True)):
        if isinstance(outcome, Exception):
            fleet.crashed.append(f"worker {n}: {type(outcome).__name__}: {outcome}")


async def all_succeeded(fleet: Fleet, http: aiohttp.ClientSession) -> bool:
    try:
        async with http.get(fleet.url + "/v1/queue") as r:
            q = await r.json()
    except GONE:  # a scheduler that does not answer: the assertions below say what was left
        return False
    return q["queued"] == 0 and q["running"] == 0


async def every_task(url: str) -> list[dict]:
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        while True:
            async with http.get(f"{url}/v1/tasks", params={"limit": 1000, "offset": len(out)}) as r:
                page = (await r.json())["tasks"]
            out += page
            if len(page) < 1000:
                return out


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_fleet_through_a_scheduler_killed_midway_loses_and_duplicates_nothing(backend, request, tmp_path):
    db = str(tmp_path / "s.db") if backend == "sqlite" else request.getfixturevalue("postgres").fresh()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    extra = ["--log-level", "WARNING"]
    procs = [start_scheduler(db, port, tmp_path / "s0.log", lease_ttl=10.0, max_attempts=10, extra=extra)]

    def restart() -> None:
        procs[-1].kill()  # SIGKILL: nothing drained, nothing flushed beyond what was committed
        procs.append(start_scheduler(db, port, tmp_path / "s1.log", lease_ttl=10.0, max_attempts=10, extra=extra))
        fleet.restarted = True

    fleet = Fleet(url)
    try:
        asyncio.run(load(fleet, restart))
        tasks = asyncio.run(every_task(url))
        procs[-1].popen.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        code = procs[-1].wait(SHUTDOWN_S + 5)
        stopped_in = time.monotonic() - t0
    finally:
        for p in procs:
            if p.alive():
                p.kill()

    print(f"{backend}: {len(tasks)} tasks from {fleet.keys_offered} keys, {len(fleet.accepted)} successes accepted, "
          f"{fleet.registrations} registrations ({len(fleet.served_after)} workers served after the restart), answers {dict(sorted(fleet.codes.items()))}, "
          f"stopped in {stopped_in:.2f}s (exit {code})")
    # The fleet came back to the new process: a worker whose call was open at the kill registers again; one
    # between calls goes on with its registration, which the database kept.
    assert fleet.crashed == [], fleet.crashed  # else a worker stopped serving on the harness's own error
    assert len(procs) == 2 and len(fleet.served_after) == WORKERS and fleet.registrations > WORKERS
    assert fleet.fivexx == [], fleet.fivexx[:5]
    assert len(fleet.answered) == fleet.keys_offered > RATE * LOAD_S / 2  # every submit answered in the end
    by_key = Counter(t["idempotency_key"] for t in tasks)
    assert by_key.most_common(1)[0][1] == 1, "an idempotency key made two tasks"
    assert set(by_key) == set(fleet.answered), "a task made for no key, or a key's task missing"
    assert {t["id"] for t in tasks} == set(fleet.answered.values())
    unfinished = [(t["id"], t["status"]) for t in tasks if t["status"] != "succeeded"]
    assert unfinished == [], f"{len(unfinished)} tasks did not succeed: {unfinished[:5]}"
    assert max(fleet.accepted.values()) == 1, "a task's success was accepted twice"
    assert code == 0 and stopped_in < SHUTDOWN_S, (code, stopped_in)
