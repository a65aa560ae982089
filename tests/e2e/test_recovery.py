"""Failure paths with real processes: killed workers, crashed ranks, a crashed scheduler."""

from __future__ import annotations

import re
import time

import psutil
import pytest

from launch.local import wait_until
from tests.harness import rank_pid, ready_worker

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


@pytest.mark.parametrize("exchange", [False, True], ids=["calls", "exchange"])
def test_task_of_a_killed_worker_is_completed_once_by_a_restarted_worker(make_stack, exchange):
    # One rank each: the lease's expiry and the one object are the scheduler's and the store's
    # doing; what a group of ranks does when one dies is in the tests below. With the exchange, the
    # worker dies between the call that told its start and the one that would carry its result.
    stack = make_stack(lease_ttl=3.0)
    # 1024x1024 takes a few seconds on the tiny model: long enough to kill the worker mid-task.
    task = stack.client.submit({"prompt": "a slow one", "width": 1024, "height": 1024})
    first = stack.worker(nproc=1, overrides=[f"queue.exchange={str(exchange).lower()}"])
    wait_until(lambda: stack.client.task(task["id"])["status"] == "processing", 120, "processing", first)
    first_id = stack.client.task(task["id"])["worker_id"]
    first.kill()  # SIGKILL to torchrun and both ranks: no drain, no report
    assert stack.client.task(task["id"])["status"] == "processing"

    second = stack.worker(nproc=1, overrides=[f"queue.exchange={str(exchange).lower()}"])
    done = stack.client.wait([task["id"]], 120, proc=second)[task["id"]]
    assert done["status"] == "succeeded" and done["attempts"] == 2
    assert done["worker_id"] != first_id
    objects = stack.objects()
    assert [p.name for p in objects] == [f"{task['id']}.jpg"]  # exactly once in the store


def test_without_restarts_a_crashed_rank_ends_the_worker_non_zero(make_stack):
    stack = make_stack()
    proc = stack.worker(nproc=2, max_restarts=0)
    ready_worker(stack, proc)
    psutil.Process(rank_pid(proc, 1)).kill()
    assert proc.wait(90) != 0


def test_worker_survives_a_scheduler_crash_and_registers_again_when_it_returns_without_its_database(make_stack):
    # One worker through both outages, one rank: the lease calls and the registration are rank 0's.
    stack = make_stack()
    proc = stack.worker(nproc=1)
    worker = ready_worker(stack, proc)
    stack.scheduler.kill()
    # The outage seen and retried through, rather than a fixed wait: two lease calls failed.
    wait_until(lambda: proc.output().count("lease failed") >= 2, 60, "two failed lease calls", proc)
    assert proc.alive()
    stack.scheduler = stack.start_scheduler()  # same port, same database
    task = stack.client.submit({"prompt": "after the outage"})
    done = stack.client.wait([task["id"]], 60, proc=proc)[task["id"]]
    assert done["status"] == "succeeded" and done["worker_id"] == worker["id"]

    stack.scheduler.kill()
    for f in stack.tmp.glob("scheduler.db*"):
        f.unlink()  # the scheduler returns with an empty database
    stack.scheduler = stack.start_scheduler()
    task = stack.client.submit({"prompt": "new database"})
    done = stack.client.wait([task["id"]], 60, proc=proc)[task["id"]]
    assert done["status"] == "succeeded" and done["worker_id"] != worker["id"]
    fresh, = stack.registered()
    assert fresh["world_size"] == 1 and len(fresh["devices"]) == 1


def test_after_a_rank_crash_the_tasks_the_group_held_succeed_soon_after_the_restart(make_stack):
    # Leases and liveness that outlive the test: the held tasks can only come back through the restarted
    # group's registration, never through a lease's expiry or the group being declared lost. A bound on
    # wall time would say the same less surely and fail on a slow machine (8 tiny-model images ended
    # 21.8 s after the restart on a loaded CI).
    stack = make_stack(lease_ttl=3600.0, scheduler_args=["--store-liveness-s", "3600"])
    # One restart must be enough: before the per-attempt store prefix (worker.ranks.distributed), the
    # restarted group read the dead group's addresses and failed or hung.
    proc = stack.worker(nproc=2, max_restarts=1)
    first = ready_worker(stack, proc)
    ids = [stack.client.submit({"prompt": f"held {i}", "width": 512, "height": 512})["id"] for i in range(8)]
    held = wait_until(lambda: [t for t in ids if stack.client.task(t)["status"] in ("leased", "processing")
                               and stack.client.task(t)["worker_id"] == first["id"]] or None,
                      60, "tasks held by the group", proc)
    psutil.Process(rank_pid(proc, 1)).kill()
    # Rank 0 fails in its next collective and exits; torchrun restarts both ranks, which register anew.
    second = ready_worker(stack, proc, known=1)
    done = stack.client.wait(ids, 120, proc=proc)
    assert all(t["status"] == "succeeded" for t in done.values()), {t: v["status"] for t, v in done.items()}
    retried = [t for t in held if done[t]["attempts"] == 2]
    assert retried and all(done[t]["worker_id"] == second["id"] for t in retried)
    old = next(w for w in stack.registered() if w["id"] == first["id"])
    assert old["status"] == "replaced" and old["node_id"] == second["node_id"] is not None
    assert re.search(rf"node {re.escape(second['node_id'])} restarted: [1-9]\d* task\(s\) it held requeued",
                     stack.scheduler.output())
    assert "exiting so the group is restarted" in proc.output()
    task = stack.client.submit({"prompt": "after the crash"})  # and the restarted group serves new work
    assert stack.client.wait([task["id"]], 60, proc=proc)[task["id"]]["status"] == "succeeded"


def test_a_worker_killed_without_a_word_is_lost_and_its_task_leased_again_within_the_liveness_time(make_stack):
    stack = make_stack(lease_ttl=60.0, scheduler_args=["--store-liveness-s", "4"])
    task = stack.client.submit({"prompt": "a slow one", "width": 1024, "height": 1024})["id"]
    first = stack.worker(nproc=1)
    wait_until(lambda: stack.client.task(task)["status"] == "processing", 120, "processing", first)
    first_id = stack.client.task(task)["worker_id"]
    first.kill()  # no drain, no report, no more heartbeats
    killed = time.time()
    wait_until(lambda: stack.client.task(task)["status"] == "queued", 20, "the task requeued")
    requeued = time.time() - killed
    assert requeued < 4 + 1 + 2, f"requeued {requeued:.1f}s after the kill"  # liveness + sweep + slack
    old = next(w for w in stack.registered() if w["id"] == first_id)
    assert old["status"] == "lost" and old["last_heartbeat_age_s"] >= 4
    second = stack.worker(nproc=1)
    done = stack.client.wait([task], 120, proc=second)[task]
    assert done["status"] == "succeeded" and done["attempts"] == 2 and done["worker_id"] != first_id
