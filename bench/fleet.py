"""`make bench-fleet`: the queue under an open-loop model of a fleet, as a new user meets it.

W simulated GPUs speak the real protocol over loopback. Clients submit one task per call
(POST /v1/tasks) at a fixed offered rate, on a Poisson schedule that does not slow down when the
scheduler does (open loop: a slow queue gets a backlog, not a politer load). Each task is held
--work-s (+-20%) between its lease and its `succeeded` report, after a `processing` report, as the
worker does; each worker also heartbeats every --heartbeat-s with what it holds.

Two fleet shapes: `gpu` (one worker per GPU) and `node` (8-GPU nodes, 8 wide). Two protocols:
`exchange` (default; bench/fleet_exchange.py: one call per task in steady state, as the dit-worker
speaks it by default, queue.exchange = true) and `--protocol calls` (leases of 1 or up to 8, then a
`processing` and a `succeeded` report per task, one call each for a GPU, one POST /v1/reports per
status for a node; queue.exchange = false).

Each row: the store (SQLite, or PostgreSQL with one or two scheduler processes, the workers and
clients split between them), durable settings as a user runs them (SQLite synchronous=FULL;
PostgreSQL fsync, synchronous_commit and full_page_writes on, unlike the tests' server). A
`trivial` row runs the same load against an in-memory server that does no work (serve_trivial): what
the load generator itself can drive on this machine, so a short row elsewhere is the queue's.

Clients do not submit a refused task again, unless --client-retries: then they honour a 429's
Retry-After as `dit submit` does, while their 30 s last.

--adapter-sets N: each task brings one of N sets of LoRA adapters (drawn by a Zipf law, s = 1.1);
each simulated worker holds its --held most recently used sets and a task of another set costs
--adapter-load-s before its work (fetch and load). Each row runs twice: `routed`, the workers saying
the sets they hold in their exchanges as the dit-worker does, the scheduler's models.adapter_wait_s
as configured; and `blind`, saying nothing with adapter_wait_s 0 (first come, first served). Figures
add loads per 100 adapter tasks: routing under a fleet's load, the scheduler's CPU beside it.

--together: the workers register while the clients already submit, against the fresh process each
row starts (a fleet coming up, or coming back after a restart), instead of all before them.

Beside every row, a process of its own asks each scheduler's /livez once a second (1 s timeout): a
loop that stops turning shows as missed probes. At the row's end each scheduler gets SIGTERM, and
the seconds to its exit and its exit code are recorded (server.shutdown_s bounds them).

Figures: offered and accepted per second, 429s (with --client-retries, also the tasks never
admitted), submits that timed out (30 s); completed = tasks offered whose client got its 201 and
that succeeded within --seconds plus a grace of 3 x work-s (the same horizon for every row, however
long hung submits keep a run going); tasks that succeeded for a client that never got its answer,
apart; lease p50/p99 (calls that returned work); submit -> lease p99 (the wait a task saw); submit
p99; the cores of each process; for 429s, the Retry-After given against the queue wait that tasks
admitted in the same second saw (the real wait); /livez probes (answered within 1 s, the slowest);
the stop (seconds from SIGTERM to exit, exit code).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil
import uvloop

from launch.local import Proc, free_port, start_scheduler, wait_until
from bench.servers import Postgres
from bench.reports import save

REG = {"hostname": "fleet-bench", "world_size": 1, "devices": [{"name": "sim", "memory_bytes": 0}], "model": "sim",
       "version": "bench"}
from bench.fleet_exchange import RESULT, ExchangeWorker
SUBMIT_TIMEOUT_S = 30.0


@dataclass
class Record:
    """What the generator saw, with perf_counter times."""

    # Each task's last submit call: (sent, ms, code, retry-after); the calls before it, refused and retried, apart.
    submits: list[tuple[float, float, int, float | None]] = field(default_factory=list)
    retried: list[tuple[float, float, int, float | None]] = field(default_factory=list)  # 429s submitted again
    sent_at: dict[str, tuple[float, float]] = field(default_factory=dict)  # task id -> (submit sent, answered)
    waits: list[tuple[float, float]] = field(default_factory=list)  # (submit sent, submit -> lease s)
    # (ms from when the lease could be answered (sent, or its first task accepted if later), tasks got)
    leases: list[tuple[float, int]] = field(default_factory=list)
    succeeded: dict[str, float] = field(default_factory=dict)  # task id -> when its success was accepted
    offer_started: float = 0.0
    heartbeats: list[int] = field(default_factory=lambda: [0, 0])  # refused, answered
    errors: list[str] = field(default_factory=list)
    worker_calls: int = 0  # the workers' calls but heartbeats: leases, reports, exchanges
    adapter_tasks: int = 0  # tasks run that brought adapters
    adapter_loads: int = 0  # of them, those whose set the worker did not hold


@dataclass(frozen=True)
class Adapters:
    """--adapter-sets: the sets tasks bring and how the simulated workers hold them."""

    sets: int
    held: int
    load_s: float
    say: bool  # routed: the workers say what they hold; blind: they do not

    def loras(self, rng: random.Random) -> list[dict]:
        k = rng.choices(range(self.sets), [1 / (i + 1) ** 1.1 for i in range(self.sets)])[0]
        return [{"source": f"https://bench.invalid/set-{k}.safetensors"}]


class Fleet:
    """The simulated workers and clients, on one event loop."""

    def __init__(self, urls: list[str], gpus: int, shape: str, rate: float, seconds: float, work_s: float,
                 heartbeat_s: float, client_retries: bool = False, together: bool = False,
                 protocol: str = "calls", adapters: Adapters | None = None) -> None:
        self.urls, self.shape, self.rate, self.seconds = urls, shape, rate, seconds
        self.protocol = protocol
        self.adapters = adapters
        self._draw = random.Random(7)  # each task's set of adapters, the same sequence for both routes
        self.client_retries = client_retries
        self.together = together
        self.width = 8 if shape == "node" else 1
        self.workers = math.ceil(gpus / self.width)
        self.work_s, self.heartbeat_s = work_s, heartbeat_s
        self.rec = Record()
        self.stop = asyncio.Event()

    async def run(self) -> Record:
        conns = [(self._session(), self._session()) for _ in range(self.workers)]
        clients = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=SUBMIT_TIMEOUT_S)) for _ in self.urls]
        try:
            # Hundreds of coroutines in one process: a full collection stalls all of them at once.
            gc.disable()
            loops = [asyncio.create_task(self._worker(c, self.urls[i % len(self.urls)]))
                     for i, c in enumerate(conns)]
            if not self.together:
                while self.registered < self.workers and not any(t.done() for t in loops):
                    await asyncio.sleep(0.05)
                await asyncio.sleep(1.0)  # every worker in its first long poll
            await self._offer(clients)
            await self._drain()
            self.stop.set()
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
        finally:
            gc.enable()
            for s in [c for pair in conns for c in pair] + clients:
                await s.close()
        return self.rec

    @property
    def grace_s(self) -> float:
        """How long tasks in flight get to finish once submitting has stopped."""
        return 3 * self.work_s * 1.2 + 2.0

    @staticmethod
    def _session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=aiohttp.ClientTimeout(total=60))

    registered = 0

    async def _register(self, http: aiohttp.ClientSession, url: str) -> str:
        async with http.post(url + "/v1/workers", json={**REG, "world_size": 1}) as r:
            wid = (await r.json())["worker_id"]
        self.registered += 1
        return wid

    async def _offer(self, clients: list[aiohttp.ClientSession]) -> None:
        """Submits on a Poisson schedule for `seconds`, each on its own coroutine (open loop)."""
        start = self.rec.offer_started = time.perf_counter()
        due, n, pending = start, 0, set()
        while due - start < self.seconds:
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            i = n % len(clients)
            t = asyncio.create_task(self._submit(clients[i], self.urls[i], n))
            pending.add(t)
            t.add_done_callback(pending.discard)
            n += 1
            due += random.expovariate(self.rate)
        if pending:
            await asyncio.wait(pending)

    async def _submit(self, http: aiohttp.ClientSession, url: str, n: int) -> None:
        """One task's submit; with client_retries, a 429 is submitted again after its Retry-After, as
        `dit submit` does, while the client's 30 s are not over. A task admitted on a retry counts
        its submit -> lease from its first try: the wait its client saw."""
        first = sent = time.perf_counter()
        while True:
            code, retry = await self._post(http, url, n, first)
            call = (sent, (time.perf_counter() - sent) * 1e3, code, retry)
            again = retry if code == 429 and self.client_retries and not math.isnan(retry) else None
            if again is None or time.perf_counter() + again - first >= SUBMIT_TIMEOUT_S:
                self.rec.submits.append(call)
                return
            self.rec.retried.append(call)
            await asyncio.sleep(again)
            sent = time.perf_counter()

    async def _post(self, http: aiohttp.ClientSession, url: str, n: int, first: float) -> tuple[int, float | None]:
        try:
            task = {"prompt": f"fleet {n}"} | ({"loras": self.adapters.loras(self._draw)} if self.adapters else {})
            async with http.post(url + "/v1/tasks", json={"input": task}) as r:
                if r.status == 201:
                    self.rec.sent_at[(await r.json())["id"]] = (first, time.perf_counter())
                elif r.status == 429:
                    return 429, float(r.headers.get("Retry-After", "nan"))
                return r.status, None
        except asyncio.TimeoutError:
            return -1, None
        except aiohttp.ClientError as e:
            self.rec.errors.append(repr(e))
            return -2, None

    async def _drain(self) -> None:
        """Until every task whose submit was answered has succeeded, or the grace after the last submit ends."""
        end = time.perf_counter() + self.grace_s
        while time.perf_counter() < end and self.rec.sent_at.keys() - self.rec.succeeded.keys():
            await asyncio.sleep(0.1)

    async def _worker(self, conns: tuple[aiohttp.ClientSession, aiohttp.ClientSession], url: str) -> None:
        """Registers, then leases for its free GPUs (up to `width`) on one connection while finished
        tasks are reported on another, as the worker's lease-ahead and reporter threads do."""
        lease_http, report_http = conns
        try:
            wid = await self._register(lease_http, url)
        except Exception as e:  # the scheduler refused or is not answering: counted, this worker is out
            self.rec.errors.append(f"register: {e!r}")
            return
        if self.protocol == "exchange":
            return await self._exchanging(ExchangeWorker(self, lease_http, report_http, url, wid))
        free = asyncio.Semaphore(self.width)
        held: dict[str, dict] = {}
        done: list[dict] = []
        flush = asyncio.Event()
        running: set[asyncio.Task] = set()
        tasks = [asyncio.create_task(self._heartbeat(report_http, url, wid, held)),
                 asyncio.create_task(self._reporter(report_http, url, wid, done, flush, held))]
        try:
            while not self.stop.is_set():
                await free.acquire()
                n = 1
                while n < self.width and not free.locked():
                    await free.acquire()
                    n += 1
                t = time.perf_counter()
                self.rec.worker_calls += 1
                async with lease_http.post(f"{url}/v1/workers/{wid}/lease",
                                           json={"max_tasks": n, "wait_s": 10.0}) as r:
                    got = (await r.json())["leases"] if r.status == 200 else []
                now = time.perf_counter()
                for _ in range(n - len(got)):
                    free.release()
                if not got:
                    continue
                known = [self.rec.sent_at[le["task_id"]] for le in got if le["task_id"] in self.rec.sent_at]
                ready = min((acc for _, acc in known), default=t)
                self.rec.leases.append(((now - max(t, ready)) * 1e3, len(got)))
                self.rec.waits.extend((sent, now - sent) for sent, _ in known)
                for le in got:
                    held[le["task_id"]] = le
                await self._report(report_http, url, wid, got, "processing")
                for le in got:
                    running.add(t := asyncio.create_task(self._gpu(le, free, done, flush)))
                    t.add_done_callback(running.discard)
        except asyncio.CancelledError:
            pass
        except Exception as e:  # a bench bug or a refused call: counted, the worker stops
            self.rec.errors.append(repr(e))
        finally:
            for t in [*tasks, *running]:
                t.cancel()

    async def _exchanging(self, worker: ExchangeWorker) -> None:
        beats = asyncio.create_task(self._heartbeat(worker.side, worker.url, worker.wid, worker.held))
        try:
            await worker.run()
        except asyncio.CancelledError:
            pass
        except Exception as e:  # a bench bug or a refused call: counted, the worker stops
            self.rec.errors.append(repr(e))
        finally:
            beats.cancel()

    async def _gpu(self, le: dict, free: asyncio.Semaphore, done: list, flush: asyncio.Event) -> None:
        await asyncio.sleep(self.work_s * random.uniform(0.8, 1.2))
        free.release()
        done.append(le)
        flush.set()

    async def _reporter(self, http: aiohttp.ClientSession, url: str, wid: str, done: list, flush: asyncio.Event,
                        held: dict) -> None:
        """Reports what finished, in one call for all that finished meanwhile (a node's batch)."""
        while True:
            await flush.wait()
            flush.clear()
            batch, done[:] = list(done), []
            await self._report(http, url, wid, batch, "succeeded")
            for le in batch:  # in flight until reported, as the worker's heartbeat says
                held.pop(le["task_id"], None)

    async def _report(self, http: aiohttp.ClientSession, url: str, wid: str, got: list[dict], status: str) -> None:
        """One call per report for a 1-GPU worker; one POST /v1/reports for a node's batch."""
        extra = {"result": RESULT} if status == "succeeded" else {}
        ok: list[str] = []
        if self.width == 1:
            for le in got:
                self.rec.worker_calls += 1
                async with http.post(f"{url}/v1/tasks/{le['task_id']}/report", json={
                        "worker_id": wid, "lease_token": le["lease_token"], "status": status, **extra}) as r:
                    if r.status == 200:
                        ok.append(le["task_id"])
        else:
            self.rec.worker_calls += 1
            async with http.post(url + "/v1/reports", json={"reports": [
                    {"task_id": le["task_id"], "worker_id": wid, "lease_token": le["lease_token"], "status": status,
                     **extra} for le in got]}) as r:
                answer = await r.json()
            ok = [le["task_id"] for le, res in zip(got, answer["results"]) if res["status_code"] == 200]
        if status == "succeeded":
            now = time.perf_counter()
            self.rec.succeeded.update((tid, now) for tid in ok)

    async def _heartbeat(self, http: aiohttp.ClientSession, url: str, wid: str, held: dict) -> None:
        await asyncio.sleep(random.uniform(0, self.heartbeat_s))
        while True:
            async with http.post(f"{url}/v1/workers/{wid}/heartbeat", json={
                    "status": "ready", "in_flight": list(held), "timestamp": time.time()}) as r:
                self.rec.heartbeats[r.status == 200] += 1
            await asyncio.sleep(self.heartbeat_s)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 1)


def figures(rec: Record, fleet: Fleet) -> dict:
    codes = [c for _, _, c, _ in rec.submits]  # each task's last call
    offered = len(codes)
    calls = rec.submits + rec.retried
    accepted = codes.count(201)
    waits_s = [w for _, w in rec.waits]
    # Counted at one horizon for every row: submits that hang (until their 30 s timeout) would
    # otherwise lengthen a run and give the queue more time to drain; and only tasks whose client
    # got its 201 (a task made for a client that gave up is work nobody receives).
    horizon = rec.offer_started + fleet.seconds + fleet.grace_s
    completed = sum(1 for tid, at in rec.succeeded.items() if at <= horizon and tid in rec.sent_at)
    out = {"offered_per_s": round(offered / fleet.seconds, 1), "accepted_per_s": round(accepted / fleet.seconds, 1),
           "completed": round(completed / offered, 4) if offered else 0.0, "completed_tasks": completed,
           "succeeded_unanswered": sum(1 for tid in rec.succeeded if tid not in rec.sent_at),
           "refused_429": codes.count(429) + len(rec.retried), "never_admitted_429": codes.count(429),
           "timed_out": codes.count(-1), "other_errors": offered - accepted - codes.count(429) - codes.count(-1),
           "lease_p50_ms": pct([m for m, _ in rec.leases], 0.5), "lease_p99_ms": pct([m for m, _ in rec.leases], 0.99),
           "submit_to_lease_p50_ms": pct([w * 1e3 for w in waits_s], 0.5),
           "submit_to_lease_p99_ms": pct([w * 1e3 for w in waits_s], 0.99),
           "submit_p99_ms": pct([m for _, m, _, _ in calls], 0.99),
           "submit_max_ms": pct([m for _, m, _, _ in calls], 1.0),
           "heartbeats": rec.heartbeats[1], "heartbeats_refused": rec.heartbeats[0], "errors": rec.errors[:5],
           # What a task cost in workers' calls (heartbeats apart), the tasks in flight at the end counted too.
           "worker_calls_per_task": round(rec.worker_calls / completed, 2) if completed else None}
    out.update(retry_after_against_wait(rec))
    if (plan := fleet.adapters) is not None:
        out["adapters"] = {"sets": plan.sets, "held": plan.held, "load_s": plan.load_s,
                           "route": "routed" if plan.say else "blind", "tasks": rec.adapter_tasks,
                           "loads_per_100_tasks": round(100 * rec.adapter_loads / rec.adapter_tasks, 1)
                           if rec.adapter_tasks else None}
    return out


def retry_after_against_wait(rec: Record) -> dict:
    """For each 429: its Retry-After over the median submit -> lease wait of the tasks admitted in the
    same second (what a task let in then really waited)."""
    by_second: dict[int, list[float]] = {}
    for sent, wait in rec.waits:
        by_second.setdefault(int(sent), []).append(wait)
    ratios = []
    for sent, _, code, retry in rec.submits + rec.retried:
        if code == 429 and retry is not None and not math.isnan(retry) and (w := by_second.get(int(sent))):
            ratios.append(retry / max(statistics.median(w), 1e-3))
    if not ratios:
        return {}
    return {"retry_after_over_wait_p50": round(statistics.median(ratios), 2),
            "retry_after_within_50pct": round(sum(0.5 <= r <= 1.5 for r in ratios) / len(ratios), 3)}


# ---------------------------------------------------------------- the trivial server


def serve_trivial(port: int) -> None:
    """The protocol's hot calls answered from memory, no checks, no storage: the generator's ceiling."""
    from aiohttp import web

    queue: deque[str] = deque()
    waiting: deque[asyncio.Future] = deque()

    async def register(_):
        return web.json_response({"worker_id": f"w{random.getrandbits(48):x}", "lease_ttl_s": 60}, status=201)

    async def submit(_req):
        tid = f"t{random.getrandbits(64):x}"
        queue.append(tid)
        while waiting:
            if not (f := waiting.popleft()).done():
                f.set_result(None)
                break
        return web.json_response({"id": tid, "status": "queued"}, status=201)

    async def taken(max_tasks: int, wait_s: float) -> list[str]:
        """Up to max_tasks queued ids, waiting up to wait_s for the first (a long poll)."""
        end = time.monotonic() + wait_s
        while not queue and time.monotonic() < end:
            fut = asyncio.get_running_loop().create_future()
            waiting.append(fut)
            await asyncio.wait({fut}, timeout=end - time.monotonic())
        return [queue.popleft() for _ in range(min(max_tasks, len(queue)))]

    async def lease(req):
        body = await req.json()
        got = await taken(body["max_tasks"], body["wait_s"])
        if not got:
            return web.Response(status=204)
        return web.json_response({"leases": [{"task_id": t, "lease_token": "x"} for t in got]})

    async def report(_):
        return web.json_response({"status": "ok"})

    async def reports(req):
        body = await req.json()
        return web.json_response({"results": [{"status_code": 200} for _ in body["reports"]]})

    async def exchange(req):
        body = await req.json()
        results = [{"task_id": r["task_id"], "status_code": 200} for r in body["reports"]]
        got = await taken(body["max_tasks"], body["wait_s"] if body["max_tasks"] else 0.0)
        return web.json_response({"results": results, "leases": [{"task_id": t, "lease_token": "x"} for t in got],
                                  "cancelled": []})

    async def health(_):
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.add_routes([web.post("/v1/workers", register), web.post("/v1/tasks", submit),
                    web.post("/v1/workers/{w}/lease", lease), web.post("/v1/workers/{w}/heartbeat", report),
                    web.post("/v1/tasks/{t}/report", report), web.post("/v1/reports", reports),
                    web.post("/v1/workers/{w}/exchange", exchange),
                    web.get("/healthz", health), web.get("/livez", health)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=uvloop.new_event_loop())


# ---------------------------------------------------------------- /livez, from a process of its own


def probe_livez(out: Path, urls: list[str]) -> None:
    """Until SIGTERM: each scheduler's /livez once a second, 1 s timeout, as a supervisor probes it;
    a JSON line per probe (url, seconds since the first, ms or null when it did not answer within the
    second, and then the error)."""
    import httpx

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    started = time.monotonic()
    with open(out, "a") as f, httpx.Client(timeout=1.0) as http:
        while not stop:
            due = time.monotonic() + 1.0
            for url in urls:
                t0 = time.perf_counter()
                error = None
                try:
                    ok = http.get(url + "/livez").status_code == 200
                except httpx.HTTPError as e:
                    ok, error = False, type(e).__name__
                ms = (time.perf_counter() - t0) * 1e3
                f.write(json.dumps({"url": url, "at_s": round(time.monotonic() - started, 1),
                                    "ms": round(ms, 1) if ok else None, "error": error}) + "\n")
                f.flush()
            time.sleep(max(0.0, due - time.monotonic()))


def _first_probe(prober: subprocess.Popen, path: Path, limit_s: float = 60.0) -> None:
    """Waits for the prober's first probe, so that its probes cover the run from its first second
    (its start took most of a short run on a loaded machine, leaving it one probe)."""
    deadline = time.monotonic() + limit_s
    while not (path.exists() and path.stat().st_size):
        if prober.poll() is not None:
            raise RuntimeError(f"the /livez prober exited {prober.returncode} before its first probe")
        if time.monotonic() > deadline:
            prober.kill()
            raise RuntimeError(f"the /livez prober made no probe in {limit_s:.0f} s")
        time.sleep(0.05)


def livez_figures(path: Path) -> dict:
    probes = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    answered = [p["ms"] for p in probes if p["ms"] is not None and p["ms"] <= 1000]
    return {"livez_probes": len(probes), "livez_missed": len(probes) - len(answered),
            "livez_max_ms": max(answered, default=None),
            "livez_errors": dict(Counter(p.get("error") for p in probes if p["ms"] is None)),
            "livez_missed_at_s": [p["at_s"] for p in probes if p["ms"] is None or p["ms"] > 1000]}


# ---------------------------------------------------------------- runs


def start_servers(store: str, work: Path, pg: Postgres | None, extra: list[str]) -> list[Proc]:
    if store == "trivial":
        port = free_port()
        proc = Proc([sys.executable, "-m", "bench.fleet", "serve-trivial", str(port)], work / "trivial.log")
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/healthz"), 30, "the trivial server", proc)
        proc.port = port
        return [proc]
    db = str(work / f"{store}-{time.monotonic_ns()}.db") if store == "sqlite" else pg.fresh()
    procs = []
    for i in range(2 if store == "postgres-2" else 1):
        port = free_port()
        procs.append(start_scheduler(db, port, work / f"{store}-{i}.log", lease_ttl=60.0,
                                     extra=["--logging-level", "WARNING", *extra]))
        procs[-1].port = port
    return procs


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def plan_pins(servers: int, cpus: set[int]) -> tuple[list[set[int]], set[int]]:
    """--pin: a core of its own for each server process, the rest for the load generator."""
    order = sorted(cpus)
    if len(order) < servers + 1:
        raise SystemExit(f"--pin needs a core for each of the {servers} server process(es) and one for the load "
                         f"generator; this process may use {len(order)}")
    return [{c} for c in order[:servers]], set(order[servers:])


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` on `cpus` (threads it starts later inherit it from theirs)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


def pin_row(procs: list[Proc]) -> dict:
    """The servers each on a core of its own, this process (the load generator) on the rest; the
    database is left where it is. As on a machine with cores to spare, on one with few."""
    own, rest = plan_pins(len(procs), os.sched_getaffinity(0))
    for proc, cpus in zip(procs, own):
        pin(proc.pid, cpus)
    pin(os.getpid(), rest)
    return {"servers": [sorted(c) for c in own], "load generator": sorted(rest)}


def run_row(store: str, shape: str, gpus: int, rate: float, args, work: Path, pg: Postgres | None,
            extra: list[str] = (), adapters: Adapters | None = None) -> dict:
    procs = start_servers(store, work, pg, list(extra))
    everywhere = os.sched_getaffinity(0)
    try:
        pinned = pin_row(procs) if args.pin else None
    except BaseException:
        for p in procs:
            p.stop()
        raise
    urls = [f"http://127.0.0.1:{p.port}" for p in procs]
    fleet = Fleet(urls, gpus, shape, rate, args.seconds, args.work_s, args.heartbeat_s, args.client_retries,
                  args.together, args.protocol, adapters)
    probes = args.out.parent / f"livez-{store}-{shape}-{time.monotonic_ns()}.jsonl"  # kept beside the report
    prober = subprocess.Popen([sys.executable, "-m", "bench.fleet", "probe-livez", str(probes), *urls])
    try:
        _first_probe(prober, probes)
    except RuntimeError:
        stop_all(procs)
        raise
    watched = {"scheduler" if store != "trivial" else "server": [psutil.Process(p.pid) for p in procs],
               "load generator": [psutil.Process()]}
    cpu0 = {k: sum(sum(p.cpu_times()[:2]) for p in ps) for k, ps in watched.items()}
    machine0, t0 = _machine_cpu(), time.perf_counter()
    try:
        rec = uvloop.run(fleet.run())
    finally:
        seconds = time.perf_counter() - t0
        cpu_s = {k: sum(sum(p.cpu_times()[:2]) for p in ps) - cpu0[k] for k, ps in watched.items()}
        cores = {k: round(v / seconds, 2) for k, v in cpu_s.items()}
        cores["others (database)"] = round((_machine_cpu() - machine0) / seconds - sum(cores.values()), 2)
        prober.send_signal(signal.SIGTERM)
        prober.wait(10)
        lag = loop_lag(urls) if store != "trivial" else {}
        stops = stop_all(procs)
        if pinned:
            pin(os.getpid(), everywhere)
    row = figures(rec, fleet)
    server = next(iter(cpu_s.values()))  # the scheduler processes (or the trivial server), all of them
    # What a completed task cost the server's processes in CPU, everything it did included (refusals,
    # heartbeats, the tasks still in flight at the end): the figure a cheaper call shows up in.
    row["server_cpu_ms_per_task"] = round(server * 1e3 / row["completed_tasks"], 2) if row["completed_tasks"] else None
    return {"store": store, "processes": len(procs), "shape": shape, "protocol": fleet.protocol, "gpus": gpus,
            "workers": fleet.workers,
            "client_retries": fleet.client_retries, "together": fleet.together, **row,
            **livez_figures(probes), **lag, **stops, "cores": cores, **({"pinned": pinned} if pinned else {})}


def loop_lag(urls: list[str]) -> dict:
    """The schedulers' event-loop lag over the row (their histogram, summed): the share of beats later
    than 0.1 s and 1 s, and the bucket the 99th percentile falls in."""
    import httpx

    buckets: dict[float, float] = {}
    for url in urls:
        try:
            text = httpx.get(url + "/metrics", timeout=10).text
        except httpx.HTTPError:
            return {}
        for line in text.splitlines():
            if line.startswith("dit_scheduler_event_loop_lag_seconds_bucket"):
                le = float(line.split('le="', 1)[1].split('"', 1)[0])
                buckets[le] = buckets.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    total = buckets.get(math.inf, 0.0)
    if not total:
        return {}
    p99 = min(le for le, n in buckets.items() if n >= 0.99 * total)
    return {"loop_lag_over_100ms": round(1 - buckets[0.1] / total, 3), "loop_lag_over_1s": round(1 - buckets[1.0] / total, 3),
            "loop_lag_p99_le_s": p99}


def stop_all(procs: list[Proc], timeout_s: float = 30.0) -> dict:
    """SIGTERM to each server in turn: the seconds each took to exit (about timeout_s: it did not, and
    was killed then) and its exit code."""
    took, codes = [], []
    for p in procs:
        t0 = time.perf_counter()
        codes.append(p.stop(timeout_s))
        took.append(round(time.perf_counter() - t0, 2))
    return {"stop_s": took, "exit_codes": codes}


def _machine_cpu() -> float:
    t = psutil.cpu_times()
    return t.user + t.system + getattr(t, "nice", 0) + getattr(t, "irq", 0) + getattr(t, "softirq", 0)


def print_row(row: dict, label: str = "") -> None:
    def f(v):
        return "-" if v is None else f"{v:g}"
    print(f"{label or row['store']:12s} x{row['processes']} {row['shape']:4s} {row.get('protocol', 'calls'):8s}"
          f" {row['gpus']:4d} GPUs"
          f"  offered {row['offered_per_s']:6.1f}/s  completed {row['completed'] * 100:5.1f}%"
          f"  lease p99 {f(row['lease_p99_ms']):>7s} ms  submit->lease p99 {f(row['submit_to_lease_p99_ms']):>8s} ms"
          f"  submit p99 {f(row['submit_p99_ms']):>7s} max {f(row['submit_max_ms']):>7s} ms"
          f"  429 {row['refused_429']}"
          + (f" (never admitted: {row['never_admitted_429']})" if row["client_retries"] else "")
          + f"  timeouts {row['timed_out']} (made anyway: {row['succeeded_unanswered']})"
          + (f"  Retry-After/wait p50 {row['retry_after_over_wait_p50']}"
             f" ({row['retry_after_within_50pct'] * 100:.0f}% within 50%)" if "retry_after_over_wait_p50" in row else "")
          + f"  livez missed {row['livez_missed']}/{row['livez_probes']} (max {f(row['livez_max_ms'])} ms)"
          + (f"  loop lag p99 <= {row['loop_lag_p99_le_s']} s, over 1 s {row['loop_lag_over_1s'] * 100:.1f}%"
             if "loop_lag_p99_le_s" in row else "")
          + f"  stop {row['stop_s']} s exit {row['exit_codes']}"
          + f"  CPU/task {f(row['server_cpu_ms_per_task'])} ms  calls/task {f(row.get('worker_calls_per_task'))}"
          + (f"  adapters {a['route']} loads/100 tasks {f(a['loads_per_100_tasks'])}" if (a := row.get("adapters")) else "")
          + f"  cores {row['cores']}", flush=True)


def routes(args, store: str) -> list[Adapters | None]:
    """The rows each store and shape gets: one without adapters; with them, routed then blind (the
    trivial server ignores adapters: routed only)."""
    if not args.adapter_sets:
        return [None]
    plans = [Adapters(args.adapter_sets, args.held, args.adapter_load_s, say) for say in (True, False)]
    return plans[:1] if store == "trivial" else plans


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve-trivial"]:
        serve_trivial(int(argv[1]))
        return 0
    if argv[:1] == ["probe-livez"]:
        probe_livez(Path(argv[1]), argv[2:])
        return 0
    p = argparse.ArgumentParser(prog="python -m bench fleet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=500)
    p.add_argument("--load", type=float, default=0.9, help="offered tasks/s as a share of what the GPUs can make")
    p.add_argument("--seconds", type=float, default=60.0, help="how long clients submit")
    p.add_argument("--work-s", type=float, default=0.6, help="simulated GPU time per task (+-20%%)")
    p.add_argument("--heartbeat-s", type=float, default=30.0)
    p.add_argument("--stores", default="trivial,sqlite,postgres,postgres-2")
    p.add_argument("--shapes", default="gpu,node")
    p.add_argument("--overload-gpus", type=int, default=100,
                   help="GPUs for the 2x overload row (on the default store); 0: no such row")
    p.add_argument("--set", action="append", default=[], help="a scheduler setting for every row (--set k=v)")
    p.add_argument("--pin", action="store_true",
                   help="each scheduler process (or the trivial server) on a core of its own, all its threads, and "
                        "the load generator on the cores left (the database unpinned): a machine with cores to "
                        "spare, on one with few")
    p.add_argument("--client-retries", action="store_true",
                   help="clients submit a refused task again after its 429's Retry-After, as `dit submit` does, "
                        "within 30 s of their first try")
    p.add_argument("--together", action="store_true",
                   help="the workers register while the clients already submit (a fleet coming up against the "
                        "fresh process each row starts), instead of all before them")
    p.add_argument("--protocol", choices=("calls", "exchange"), default="exchange",
                   help="exchange: one call per task in steady state, as the dit-worker makes them by default "
                        "(queue.exchange = true); calls: separate lease, processing and succeeded calls "
                        "(queue.exchange = false)")
    p.add_argument("--adapter-sets", type=int, default=0,
                   help="sets of LoRA adapters the tasks bring (Zipf); each row routed and blind (exchange only)")
    p.add_argument("--held", type=int, default=3, help="sets of adapters a simulated worker keeps loaded")
    p.add_argument("--adapter-load-s", type=float, default=1.0, help="fetch and load a set the worker lacks")
    p.add_argument("--repeat", type=int, default=1, help="each row this many times, a fresh process each")
    p.add_argument("--out", type=Path, default=Path("var/bench/fleet.json"))
    args = p.parse_args(argv)
    if args.adapter_sets and args.protocol != "exchange":
        p.error("--adapter-sets: the simulated workers say their adapters in exchanges; use --protocol exchange")
    if args.adapter_sets < 0 or args.held < 1 or args.adapter_load_s < 0:
        p.error("--adapter-sets >= 0, --held >= 1 and --adapter-load-s >= 0")
    extra = [a for kv in args.set for a in ("--set", kv)]
    rate = args.load * args.gpus / args.work_s
    stores = args.stores.split(",")
    if args.pin:  # refused now, before anything is measured or started
        plan_pins(max(2 if s == "postgres-2" else 1 for s in stores), os.sched_getaffinity(0))
    report = {"machine": platform.processor() or platform.machine(), "cores": psutil.cpu_count(), "gpus": args.gpus,
              "protocol": args.protocol,
              "offered_per_s": round(rate, 1), "seconds": args.seconds, "work_s": args.work_s,
              "heartbeat_s": args.heartbeat_s, "durable": True, "adapter_sets": args.adapter_sets, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        pg = Postgres(work, durable=True) if any(s.startswith("postgres") for s in stores) else None
        try:
            for store in stores:
                for shape in args.shapes.split(","):
                    for _ in range(args.repeat):
                        for plan in routes(args, store):
                            blind = ["--set", "models.adapter_wait_s=0"] if plan and not plan.say else []
                            row = run_row(store, shape, args.gpus, rate, args, work, pg, extra + blind, plan)
                            report["rows"].append(row)
                            print_row(row)
                            save(args.out, report)  # each row kept as it ends: a run cut short keeps what it measured
            if args.overload_gpus:
                over = 2.0 * args.overload_gpus / args.work_s
                row = run_row("sqlite", "gpu", args.overload_gpus, over, args, work, pg, extra)
                row["overload"] = 2.0
                report["rows"].append(row)
                print_row(row, "sqlite 2x")
                save(args.out, report)
        finally:
            if pg:
                pg.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
