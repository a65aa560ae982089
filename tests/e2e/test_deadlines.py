"""Stage deadlines and the serve-loop watchdog with real processes: a store that hangs (a GCS
emulator behind a proxy that stops answering) and a serve loop that hangs (a follower rank frozen
with SIGSTOP, so rank 0 waits in a collective). No lease outlives its deadline by more than one
heartbeat interval."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from launch.local import wait_until
from tests.harness import Emulator, HangingProxy, rank_pid, ready_worker, run

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

BUCKET = "hangs"
HEARTBEAT_S = 1.0  # the test stack's heartbeat interval


def test_a_store_that_hangs_fails_its_task_retryable_within_the_deadline(make_stack, tmp_path):
    emu = Emulator(tmp_path)
    emu.bucket(BUCKET)
    proxy = HangingProxy(emu.port)
    stack = make_stack(max_attempts=1)
    try:
        # GCS's own timeouts are far longer than the store's deadline: only the deadline can end it.
        proc = stack.worker(nproc=1, env={"STORAGE_EMULATOR_HOST": proxy.url}, overrides=[
            "storage.kind=gcs", f"storage.gcs.bucket={BUCKET}", "storage.gcs.timeout_s=30",
            "storage.gcs.deadline_s=120", "deadlines.store_s=3"])
        ready_worker(stack, proc)
        assert run(stack, [{"prompt": "before the hang"}], proc=proc)[0]["status"] == "succeeded"
        proxy.hang()
        [task] = run(stack, [{"prompt": "into the hang"}], timeout=60, proc=proc)
        assert task["status"] == "failed"
        assert task["error"]["code"] == "deadline_exceeded" and task["error"]["retryable"]
        assert task["error"]["message"] == "stage store took longer than 3s (deadlines.store_s)"
        # Generating and checking a 256x256 image takes well under a second here.
        assert task["finished_at"] - task["started_at"] < 3 + HEARTBEAT_S + 2
        proxy.resume()
        [after] = run(stack, [{"prompt": "after the hang"}], timeout=60, proc=proc)
        assert after["status"] == "succeeded"  # the worker went on serving
    finally:
        proxy.close()
        emu.stop()


def test_a_serve_loop_that_hangs_gives_its_tasks_back_and_exits(make_stack):
    stack = make_stack(lease_ttl=60.0)
    proc = stack.worker(nproc=2, max_restarts=0, overrides=[
        "deadlines.generate_s=4", "deadlines.check_s=2", "deadlines.encode_s=2", "deadlines.store_s=2",
        "deadlines.stall_s=12"])
    ready_worker(stack, proc)
    rank0, rank1 = psutil.Process(rank_pid(proc, 0)), rank_pid(proc, 1)
    os.kill(rank1, signal.SIGSTOP)  # a follower that stops answering: rank 0 waits in the gather
    try:
        stopped = time.time()
        ids = [stack.client.submit({"prompt": f"stuck {i}"})["id"] for i in range(4)]
        held_until: dict[str, float] = {}

        def all_given_back() -> bool:
            for t in ids:
                task = stack.client.task(t)
                # Leased once (it names a worker), and no longer held.
                if t not in held_until and task["worker_id"] and task["status"] in ("queued", "failed"):
                    held_until[t] = time.time()
            return len(held_until) == len(ids)

        wait_until(all_given_back, 12 + HEARTBEAT_S + 10, "every held task given back", every_s=0.2)
        psutil.wait_procs([rank0], timeout=10)
        assert not rank0.is_running() or rank0.status() == psutil.STATUS_ZOMBIE
        assert "made no progress for" in proc.output()
        assert "Every thread's stack" in proc.output() and "ranks/distributed.py" in proc.output()  # where it waited
        for t in ids:
            assert held_until[t] - stopped <= 12 + HEARTBEAT_S + 3, f"{t} held {held_until[t] - stopped:.1f}s"
        tasks = [stack.client.task(t) for t in ids]
        generating = [t for t in tasks if t["error"] and "stage generate" in t["error"]["message"]]
        assert generating, [t["error"] for t in tasks]  # the round in the frozen gather hit its deadline
        assert all(t["error"]["code"] == "deadline_exceeded" for t in generating)
        assert all(t["status"] == "queued" for t in tasks)  # all retried elsewhere, none lost
    finally:
        os.kill(rank1, signal.SIGCONT)
        proc.kill()
