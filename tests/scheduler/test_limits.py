"""Back-pressure: a rate limit per client and the queue-depth limit, both 429 with a Retry-After the
client can act on (the depth limit's estimated from the last minute's pace)."""

from __future__ import annotations

import asyncio
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from protocol import RegisterWorker, Report, TaskResult
from scheduler.api.gate import StandingQueue
from scheduler.app import create_app
from scheduler.config import ApiConfig, GateConfig
from scheduler.limits import IDLE_FLEET_RETRY_S, RateLimit, client_key, retry_after_s
from scheduler.store import SQLiteStore
from tests.harness import Clock

REGISTRATION = {"hostname": "h", "world_size": 1, "devices": [], "model": "m", "version": "v"}


def test_a_token_bucket_per_client():
    clock = Clock()
    limit = RateLimit(rate=2, burst=4, clock=clock)
    assert [limit.take("a") for _ in range(4)] == [0, 0, 0, 0]
    assert limit.take("a") == 0.5  # one token comes back every half second
    assert limit.take("b") == 0  # another client has its own bucket
    clock.now += 1.0
    assert limit.take("a", 2) == 0 and limit.take("a") == 0.5
    assert limit.take("a", 5) == math.inf  # over the burst: never
    assert RateLimit(rate=0, burst=0).take("a", 1000) == 0  # off


def test_the_client_is_its_token_digest_or_its_address():
    key = client_key("Bearer s3cret", "10.0.0.1")
    assert key.startswith("t:") and "s3cret" not in key and key != client_key("Bearer other", "10.0.0.1")
    assert client_key(None, "10.0.0.1") == "a:10.0.0.1"


def test_retry_after_follows_the_recent_pace():
    assert retry_after_s(excess=10, ended_per_s=2.0) == 5  # two a second: 10 in 5 s
    assert retry_after_s(excess=1, ended_per_s=100.0) == 1
    assert retry_after_s(excess=10**6, ended_per_s=0.1) == 3600  # capped
    assert retry_after_s(excess=5, ended_per_s=0.0) == IDLE_FLEET_RETRY_S


def test_over_the_rate_is_429_with_the_seconds_until_it_fits(make_store):
    with TestClient(create_app(make_store(), ApiConfig(gate=GateConfig(rate_limit=1, rate_burst=3)))) as http:
        codes = [http.post("/v1/tasks", json={"input": {"prompt": "x"}}).status_code for _ in range(3)]
        refused = http.post("/v1/tasks", json={"input": {"prompt": "x"}})
        assert codes == [201] * 3 and refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert "rate limit: 1 tasks/s per client" in refused.json()["detail"]
        too_big = http.post("/v1/tasks/batch", json={"tasks": [{"input": {"prompt": "x"}}] * 4})
        assert too_big.status_code == 422 and "over this client's burst (3)" in too_big.json()["detail"]
        other = http.post("/v1/tasks", json={"input": {"prompt": "x"}}, headers={"Authorization": "Bearer b"})
        assert other.status_code == 201  # auth is off, but a token still names another client


def ended_at_a_pace(http, store, clock, n: int = 10, every_s: float = 2.0) -> None:
    """n tasks end, one every `every_s` by the store's clock: an end rate of 1 / every_s per second."""
    wid, _ = store.workers.register(RegisterWorker(hostname="h", world_size=1, devices=[], model="m", version="v"))
    for _ in range(n):
        http.post("/v1/tasks", json={"input": {"prompt": "done"}})
        (lease,) = store.claims.claim(wid, 1)
        store.reports.report(lease.task_id, Report(worker_id=wid, lease_token=lease.lease_token, status="succeeded",
                                                   result=TaskResult(uri="u", content_type="image/png", width=1,
                                                                     height=1, seed=1, bytes=1, sha256="0")))
        clock.now += every_s


def test_a_full_queue_is_429_with_a_retry_after_from_the_recent_pace(make_store, clock):
    store = make_store()
    with TestClient(create_app(store, ApiConfig(gate=GateConfig(max_queued=3, read_s=0)))) as http:
        ended_at_a_pace(http, store, clock)  # ten in 20 s: 0.5 a second
        for _ in range(3):
            assert http.post("/v1/tasks", json={"input": {"prompt": "q"}}).status_code == 201
        refused = http.post("/v1/tasks/batch", json={"tasks": [{"input": {"prompt": "q"}}] * 2})
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "4"  # 2 over the limit at 0.5 a second
        assert "queue is full (3 queued, limit 3)" in refused.json()["detail"]


def test_a_task_that_would_wait_past_the_bound_is_429_with_the_wait_of_the_tasks_ahead(make_store, clock):
    store = make_store()
    with TestClient(create_app(store, ApiConfig(gate=GateConfig(max_queue_wait_s=10, read_s=0)))) as http:
        ended_at_a_pace(http, store, clock)  # 0.5 a second: a task waits 2 s per task ahead of it, and itself
        codes = [http.post("/v1/tasks", json={"input": {"prompt": f"{i}"}}).status_code for i in range(6)]
        assert codes == [201] * 5 + [429]  # the sixth would wait 12 s
        refused = http.post("/v1/tasks", json={"input": {"prompt": "late"}})
        assert refused.status_code == 429 and refused.headers["retry-after"] == "10"  # 5 ahead drain in 10 s
        assert "would wait about 12s, over the limit of 10s" in refused.json()["detail"]
        # A higher priority waits behind its own lane and those above it only.
        assert http.post("/v1/tasks", json={"input": {"prompt": "urgent"}, "priority": 5}).status_code == 201
        figures = http.get("/v1/queue").json()
        assert figures["ended_per_s"] == figures["drain_per_s"] == 0.5  # the old name, deprecated, alongside
        assert figures["wait_s_by_priority"] == {"0": 12.0, "5": 2.0}
        metrics = http.get("/metrics").text
        assert "dit_scheduler_ended_per_second 0.5" in metrics and "dit_scheduler_drain_per_second 0.5" in metrics
        assert 'dit_scheduler_queue_wait_estimate_seconds{priority="5"} 2.0' in metrics
        assert 'dit_scheduler_submissions_total{result="refused"} 2.0' in metrics


def test_no_wait_bound_until_enough_tasks_have_ended_to_measure_a_pace(make_store, clock):
    store = make_store()
    with TestClient(create_app(store, ApiConfig(gate=GateConfig(max_queue_wait_s=1, read_s=0)))) as http:
        ended_at_a_pace(http, store, clock, n=9)  # one short of a measured pace
        assert all(http.post("/v1/tasks", json={"input": {"prompt": f"{i}"}}).status_code == 201 for i in range(20))
        assert http.get("/v1/queue").json()["ended_per_s"] == 0.0


def test_pace_lets_in_what_is_stored_within_the_target_once_a_queue_of_submits_was_slow():
    clock = Clock()
    pace = StandingQueue(target_s=0.25, clock=clock)

    def judged() -> float:
        """The room the interval just ended leaves for the next (it is judged at the next check)."""
        pace.behind()
        return pace.room

    def together(n: int, took: float, fast: int = 0) -> float:
        """n submits in flight at once that take `took` seconds, beside `fast` that take none."""
        tokens = [pace.enter() for _ in range(n)]
        for _ in range(fast):
            pace.leave(pace.enter())
        clock.now += took
        for t in tokens:
            pace.leave(t)
        return judged()

    clock.now += StandingQueue.INTERVAL_S
    assert judged() == math.inf  # idle
    assert together(20, 0.9, fast=1) == math.inf  # a burst: one went through fast
    # A queue, all slow: 40 stored in 0.3 s is 133/s, so 33 may be in flight (0.25 s of them).
    assert together(40, 0.3) == 33
    tokens = [pace.enter() for _ in range(32)]
    assert not pace.behind()
    tokens.append(pace.enter())
    assert pace.behind()  # the 34th would be refused
    clock.now += StandingQueue.INTERVAL_S
    for t in tokens:
        pace.leave(t)
    clock.now += StandingQueue.INTERVAL_S
    assert judged() == math.inf  # they went through within the target
    for _ in range(10):  # slow, but one at a time: not a queue
        t = pace.enter()
        clock.now += 0.9
        pace.leave(t)
    assert judged() == math.inf


def test_pace_a_queue_that_stores_nothing_is_behind_once_its_oldest_waited_past_the_target():
    clock = Clock()
    pace = StandingQueue(target_s=0.25, clock=clock)
    tokens = [pace.enter() for _ in range(StandingQueue.MIN_QUEUE)]
    for _ in range(2):  # 0.1, then 0.2 s without a store: a pause, not yet a queue
        clock.now += StandingQueue.INTERVAL_S
        assert not pace.behind() and pace.room == math.inf
    clock.now += StandingQueue.INTERVAL_S
    assert pace.behind() and pace.room == StandingQueue.MIN_QUEUE  # 0.3 s: behind, room for those in flight
    for t in tokens:
        pace.leave(t)
    clock.now += StandingQueue.INTERVAL_S
    pace.behind()  # they took 0.3 s: still slow, at the pace they were stored (40/s: room for 10)
    assert pace.room == 10 and not pace.behind()
    clock.now += StandingQueue.INTERVAL_S
    pace.behind()
    assert pace.room == math.inf  # nothing in flight: no queue
    assert not StandingQueue(target_s=0, clock=clock).behind()  # off


@pytest.mark.parametrize("hot_path", [True, False], ids=["hot-path", "fastapi"])
def test_submits_are_429_at_once_while_the_process_is_behind_and_workers_are_still_served(tmp_path, hot_path,
                                                                                          monkeypatch):
    # Every interval is judged at the next submit, any submit is slow, and one is a queue: with one
    # in flight and none stored, the process is behind with room for one, so the next is refused;
    # once it is stored, there is room again.
    monkeypatch.setattr(StandingQueue, "INTERVAL_S", 0.0)
    monkeypatch.setattr(StandingQueue, "MIN_QUEUE", 1)  # one in flight is a queue, and the room it leaves
    store = SQLiteStore(tmp_path / "s.db")
    gate, entered = threading.Event(), threading.Event()
    stored = store.tasks.asubmit

    async def held(body):  # the store's write, held: this submit stays in flight
        entered.set()
        await asyncio.to_thread(gate.wait, 10)
        return await stored(body)

    store.tasks.asubmit = held
    task = {"input": {"prompt": "x"}}
    with TestClient(create_app(store, ApiConfig(gate=GateConfig(max_submit_s=1e-9), hot_path=hot_path))) as http, \
            ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(http.post, "/v1/tasks", json=task)
        assert entered.wait(10)
        shed = http.post("/v1/tasks", json=task)
        batch = http.post("/v1/tasks/batch", json={"tasks": [task] * 3})
        # A worker's calls drain the queue: never refused for this.
        wid = http.post("/v1/workers", json=REGISTRATION).json()["worker_id"]
        idle = http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1, "wait_s": 0})
        gate.set()
        assert in_flight.result().status_code == 201
        after = http.post("/v1/tasks", json=task)
        metrics = http.get("/metrics").text
    assert shed.status_code == batch.status_code == 429 and shed.headers["retry-after"] == "1"
    assert "take longer than 1e-09s to be taken in (api.gate.max_submit_s)" in shed.json()["detail"]
    assert idle.status_code == 204 and after.status_code == 201
    assert 'dit_scheduler_submissions_total{result="shed"} 4.0' in metrics
    store.close()


def test_pace_tells_the_refused_to_come_back_spread_out_at_the_pace_it_stored_submits():
    clock = Clock()
    pace = StandingQueue(target_s=0.25, clock=clock)
    assert pace.come_back_s() == 1  # nothing measured yet
    clock.now += 10.0
    pace.behind()  # an idle interval, judged; the ten below push it out
    for _ in range(10):  # two stored every 0.125 s: 16 a second
        pace.leave(pace.enter())
        pace.leave(pace.enter())
        clock.now += 0.125
        pace.behind()  # the interval is judged
    assert pace.intake_per_s() == 16.0
    assert [pace.come_back_s() for _ in range(40)] == [1] * 16 + [2] * 16 + [3] * 8
    clock.now += 1.0  # a second on, the schedule has moved with it
    assert pace.come_back_s() == 2
    clock.now += 10.0  # long after: the next refused comes back in a second again
    assert pace.come_back_s() == 1
