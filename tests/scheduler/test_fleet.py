"""Two scheduler processes on one PostgreSQL, 50 simulated workers speaking the real protocol over
HTTP, 2,000 tasks, and leases left to expire on purpose: every task ends exactly once, no lease is
granted twice, a stale report changes nothing, nothing is lost."""

from __future__ import annotations

import random
import threading
from collections import Counter, defaultdict

import httpx
import pytest

from launch.local import free_port, start_scheduler
from tests.harness import REG

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

TASKS, WORKERS = 2000, 50
RESULT = {"content_type": "image/png", "width": 16, "height": 16, "seed": 7, "bytes": 10, "sha256": "00"}


def test_two_schedulers_one_database_every_task_ends_exactly_once(postgres, tmp_path):
    db = postgres.fresh()
    procs, urls = [], []
    for i in range(2):
        port = free_port()
        procs.append(start_scheduler(db, port, tmp_path / f"s{i}.log", lease_ttl=1.0, max_attempts=20))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        with httpx.Client(base_url=urls[0], timeout=30) as http:
            ids = [http.post("/v1/tasks", json={"input": {"prompt": f"t{i}"}}).json()["id"] for i in range(TASKS)]
        granted: list[tuple[str, int, str]] = []  # (task, attempt, token) of every lease handed out
        accepted: Counter = Counter()  # succeeded reports answered 200, per task
        stale: list[tuple[str, int]] = []  # reports made after letting the lease expire: status codes
        lock = threading.Lock()
        done = threading.Event()

        def worker(n: int) -> None:
            rng = random.Random(n)
            with httpx.Client(base_url=urls[n % 2], timeout=30) as http:
                wid = http.post("/v1/workers", json=REG).json()["worker_id"]
                while not done.is_set():
                    resp = http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 4, "wait_s": 0.5})
                    if resp.status_code == 204:
                        continue
                    for lease in resp.json()["leases"]:
                        task, token = lease["task_id"], lease["lease_token"]
                        with lock:
                            granted.append((task, lease["attempt"], token))
                        body = {"worker_id": wid, "lease_token": token}
                        if rng.random() < 0.03:  # a worker that stalls past its lease, then reports anyway
                            done.wait(1.6)
                            code = http.post(f"/v1/tasks/{task}/report", json={
                                **body, "status": "succeeded", "result": {**RESULT, "uri": f"stale:{token}"}}).status_code
                            with lock:
                                stale.append((task, code))
                            continue
                        http.post(f"/v1/tasks/{task}/report", json={**body, "status": "processing"})
                        ok = http.post(f"/v1/tasks/{task}/report", json={
                            **body, "status": "succeeded", "result": {**RESULT, "uri": f"ok:{token}"}})
                        if ok.status_code == 200:
                            with lock:
                                accepted[task] += 1

        threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(WORKERS)]
        for t in threads:
            t.start()
        with httpx.Client(base_url=urls[1], timeout=30) as http:
            def all_ended() -> bool:
                return not http.get("/v1/tasks", params={"status": "queued", "limit": 1}).json()["tasks"] and \
                    not http.get("/v1/tasks", params={"status": "leased", "limit": 1}).json()["tasks"] and \
                    not http.get("/v1/tasks", params={"status": "processing", "limit": 1}).json()["tasks"]

            from launch.local import wait_until
            wait_until(all_ended, 300, "every task to end", every_s=0.5)
            done.set()
            for t in threads:
                t.join(10)
            final = {}
            for offset in range(0, TASKS, 1000):
                for task in http.get("/v1/tasks", params={"limit": 1000, "offset": offset}).json()["tasks"]:
                    final[task["id"]] = task
        assert set(final) == set(ids) and all(t["status"] == "succeeded" for t in final.values())  # nothing lost
        assert all(accepted[t] == 1 for t in ids)  # exactly once
        per_task = defaultdict(list)
        for task, attempt, token in granted:
            per_task[task].append((attempt, token))
        for task, got in per_task.items():  # no lease granted twice: each attempt once, each token new
            assert len({a for a, _ in got}) == len(got) == len({tok for _, tok in got}), (task, got)
        assert stale and all(code == 409 for _, code in stale)  # stale reports were refused...
        for task, _ in stale:  # ...and changed nothing: the result is the accepted attempt's
            assert final[task]["result"]["uri"].startswith("ok:")
            assert final[task]["attempts"] >= 2
    finally:
        for p in procs:
            p.stop()
