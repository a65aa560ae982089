"""A stuck event loop is seen and the process exits for a restart; a stop ends within its deadline.

The watchdog on an injected clock, then real scheduler processes: one whose loop is blocked on purpose
(its database ping made to hang, as a call that never returns would), and ones stopped by signals
while clients hold long polls and half-sent requests open."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
import threading
import time

import httpx
import pytest

from launch.local import Proc, free_port, start_scheduler, wait_healthy, wait_until
from scheduler.loop_watch import STALLED_EXIT, LoopWatch
from scheduler.server import CUT_EXIT

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_loop_quiet_past_its_limit_is_stuck_its_stacks_logged_and_the_exit_restartable(caplog):
    clock, exits = Clock(), []
    watch = LoopWatch(30.0, clock=clock, exit=exits.append)
    clock.now += 30.0
    assert not watch.check() and exits == []
    clock.now += 0.5
    with caplog.at_level(logging.CRITICAL):
        assert watch.check()
    assert exits == [STALLED_EXIT] and STALLED_EXIT != 2  # 2: a setting that cannot work, never restarted
    said = caplog.records[-1].getMessage()
    assert "has not turned for 30.5s (server.stuck_loop_s = 30s)" in said
    assert "Every thread's stack" in said and "test_a_loop_quiet_past_its_limit" in said


def test_each_beat_reports_how_late_it_ran():
    # Made, started, then each beat's (before, after): the first on time, the second 2.5 s late.
    times = iter([0.0, 0.0, 0.0, 0.25, 0.25, 3.0])
    lags: list[float] = []

    async def run():
        watch = LoopWatch(0, on_lag=lags.append, tick_s=0.0, clock=lambda: next(times))
        task = asyncio.create_task(watch.run())
        for _ in range(100):
            if len(lags) == 2:
                break
            await asyncio.sleep(0)
        task.cancel()

    asyncio.run(run())
    assert lags == [0.25, 2.75]


BLOCKED_PING = ("import sys, time\n"
                "from scheduler.store.sqlite import SQLiteStore\n"
                "SQLiteStore.ping = lambda self: time.sleep(3600)  # a database call that never returns, on the loop\n"
                "from scheduler.__main__ import main\n"
                "sys.exit(main(sys.argv[1:]))\n")


def test_a_scheduler_whose_loop_is_blocked_exits_with_its_stacks_for_a_restart(tmp_path):
    port = free_port()
    proc = Proc([sys.executable, "-c", BLOCKED_PING, "--db", str(tmp_path / "s.db"), "--port", str(port),
                 "--set", "database.busy_timeout_s=0.5", "--set", "server.stuck_loop_s=1.5",
                 "--log-format", "json"], tmp_path / "s.log")
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        with pytest.raises(httpx.TimeoutException):
            httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1.0)  # the loop now sleeps in ping
        assert proc.wait(30) == STALLED_EXIT
    finally:
        if proc.alive():
            proc.kill()
    said = proc.messages()
    assert "the event loop has not turned for" in said and "server.stuck_loop_s = 1.5s" in said
    assert "Every thread's stack" in said and 'Thread "MainThread"' in said
    assert "in acall" in said and "in <lambda>" in said  # where the loop stood: the store call that hung


def lease_waiting(url: str, worker_id: str, out: list) -> threading.Thread:
    def call():
        t0 = time.monotonic()
        r = httpx.post(f"{url}/v1/workers/{worker_id}/lease", json={"max_tasks": 1, "wait_s": 60}, timeout=90)
        out.append((r.status_code, time.monotonic() - t0))
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def test_a_stop_answers_waiting_calls_at_once_commits_and_exits_0(tmp_path):
    """Long-polling leases and a client's `Prefer: wait` would hold the stop for a minute: they are
    answered now, with what there is, and the process exits 0 well within server.shutdown_s."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_scheduler(tmp_path / "s.db", port, tmp_path / "s.log")
    try:
        reg = {"hostname": "h", "world_size": 1, "devices": [], "model": "m", "version": "v"}
        wid = httpx.post(f"{url}/v1/workers", json=reg).json()["worker_id"]
        leases: list = []
        threads = [lease_waiting(url, wid, leases) for _ in range(3)]
        # A task nobody leases (model limits aside, the three leases above wait for work): submitted
        # with a wait, its client is held until the task ends or 60 s pass.
        waited: list = []

        def submit_and_wait():
            r = httpx.post(f"{url}/v1/tasks", json={"input": {"prompt": "held"}}, headers={"Prefer": "wait=60"},
                           timeout=90)
            waited.append(r)

        metrics = httpx.get(f"{url}/metrics").text
        assert "dit_scheduler_event_loop_lag_seconds_count" in metrics
        wait_until(lambda: 'route="/v1/workers"' in httpx.get(f"{url}/metrics").text, 10, "the registration")
        time.sleep(0.5)  # the three leases in their long poll (nothing to observe from outside but time)
        threads.append(threading.Thread(target=submit_and_wait, daemon=True))
        threads[-1].start()
        wait_until(lambda: len(leases) >= 1, 10, "one lease to take the task")
        t0 = time.monotonic()
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        stopped_in = time.monotonic() - t0
        for t in threads:
            t.join(10)
    finally:
        if proc.alive():
            proc.kill()
    assert stopped_in < 3.0, f"the stop took {stopped_in:.1f}s"
    assert sorted(code for code, _ in leases) == [200, 204, 204]  # the waiting two answered, not held
    assert waited and waited[0].status_code == 201 and waited[0].json()["status"] == "leased"
    assert "SIGTERM: stopping within 10s" in proc.messages()


def half_sent(port: int) -> socket.socket:
    """A request whose body never finishes arriving: uvicorn waits for it."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
    return s


def test_a_stop_held_by_a_client_ends_within_shutdown_s_and_a_second_signal_ends_it_at_once(tmp_path):
    port, other = free_port(), free_port()
    first = start_scheduler(tmp_path / "a.db", port, tmp_path / "a.log", extra=["--set", "server.shutdown_s=2"])
    second = start_scheduler(tmp_path / "b.db", other, tmp_path / "b.log")
    held = [half_sent(port), half_sent(other)]
    try:
        time.sleep(0.2)  # both requests in their handlers, waiting for their bodies
        t0 = time.monotonic()
        first.popen.send_signal(signal.SIGTERM)
        code = first.wait(10)
        took = time.monotonic() - t0
        assert code in (0, CUT_EXIT) and took < 2.5, (code, took)  # the held call cancelled at 1.4 s

        second.popen.send_signal(signal.SIGTERM)
        wait_until(lambda: "stopping within 10s" in second.messages(), 5, "the first signal seen")
        t0 = time.monotonic()
        second.popen.send_signal(signal.SIGTERM)
        assert second.wait(5) == 128 + signal.SIGTERM
        assert time.monotonic() - t0 < 1.0
        assert "SIGTERM again while stopping: exiting now" in second.messages()
    finally:
        for s in held:
            s.close()
        for p in (first, second):
            if p.alive():
                p.kill()
