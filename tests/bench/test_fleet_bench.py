"""`make bench-fleet`: the open-loop fleet model, its arithmetic, and a short run against the trivial
server and the real scheduler."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from bench import fleet as fleet_bench
from bench.fleet import Record


def test_retry_after_is_set_against_the_wait_of_tasks_admitted_in_the_same_second():
    rec = Record()
    rec.waits = [(10.2, 4.0), (10.8, 6.0), (11.5, 20.0)]  # admitted in second 10: waited 4 and 6 s
    rec.submits = [(10.5, 1.0, 429, 5.0), (10.6, 1.0, 429, 10.0), (11.1, 1.0, 429, 9.0), (12.0, 1.0, 429, 3.0)]
    out = fleet_bench.retry_after_against_wait(rec)
    # 5/5 and 10/5 in second 10, 9/20 in second 11; second 12 admitted nothing to compare with
    assert out == {"retry_after_over_wait_p50": 1.0, "retry_after_within_50pct": pytest.approx(1 / 3, abs=1e-3)}


@pytest.mark.integration
def test_a_short_run_on_the_trivial_server_and_sqlite_completes_what_it_offers(tmp_path, capsys):
    out = tmp_path / "fleet.json"
    assert fleet_bench.main(["--gpus", "8", "--seconds", "2", "--work-s", "0.2", "--stores", "trivial,sqlite",
                             "--shapes", "gpu,node", "--overload-gpus", "0", "--protocol", "calls",
                             "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {(r["store"], r["shape"]): r for r in report["rows"]}
    assert set(rows) == {("trivial", "gpu"), ("trivial", "node"), ("sqlite", "gpu"), ("sqlite", "node")}
    assert rows["sqlite", "node"]["workers"] == 1 and rows["sqlite", "gpu"]["workers"] == 8
    for row in rows.values():
        assert row["offered_per_s"] > 10 and row["errors"] == [] and row["timed_out"] == 0
        assert row["completed"] >= 0.9  # 90% of what the GPUs make, 3 x work_s to finish
        assert row["succeeded_unanswered"] == 0  # no submit went unanswered
        assert 0 <= row["lease_p50_ms"] <= row["lease_p99_ms"] and row["submit_to_lease_p99_ms"] is not None
        assert row["livez_probes"] >= 2 and row["livez_missed"] == 0 and row["livez_max_ms"] <= 1000
        assert row["completed_tasks"] > 0 and row["server_cpu_ms_per_task"] > 0  # the server did some work
    assert [rows["sqlite", s]["exit_codes"] for s in ("gpu", "node")] == [[0], [0]]  # SIGTERM: a clean exit
    assert max(rows["sqlite", s]["stop_s"][0] for s in ("gpu", "node")) < 10  # within server.shutdown_s
    assert "trivial" in capsys.readouterr().out


@pytest.mark.integration
def test_a_fleet_speaking_the_exchange_completes_with_fewer_calls(tmp_path):
    """--protocol exchange: one call per task in steady state, against the trivial server and SQLite."""
    out = tmp_path / "fleet.json"
    assert fleet_bench.main(["--gpus", "8", "--seconds", "2", "--work-s", "0.2", "--stores", "trivial,sqlite",
                             "--shapes", "gpu,node", "--overload-gpus", "0", "--protocol", "exchange",
                             "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4 and all(r["protocol"] == "exchange" for r in rows)
    for row in rows:
        assert row["errors"] == [] and row["completed"] >= 0.9 and row["timed_out"] == 0
        assert 0 < row["worker_calls_per_task"] < 3  # the separate calls spend 3 a task (lease, two reports)


@pytest.mark.integration
def test_a_fleet_that_registers_while_clients_submit_completes_too(tmp_path):
    """--together: the first seconds of a fresh process, registrations among the first submits."""
    out = tmp_path / "fleet.json"
    assert fleet_bench.main(["--gpus", "16", "--seconds", "2", "--work-s", "0.2", "--stores", "sqlite",
                             "--shapes", "gpu", "--overload-gpus", "0", "--together", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["together"] and row["errors"] == [] and row["completed"] >= 0.9 and row["exit_codes"] == [0]


def test_completed_counts_answered_tasks_that_succeeded_within_the_one_horizon():
    fleet = fleet_bench.Fleet(["http://x"], gpus=1, shape="gpu", rate=1.0, seconds=10.0, work_s=1.0, heartbeat_s=30)
    rec = Record(offer_started=100.0)
    horizon = 100.0 + 10.0 + fleet.grace_s
    rec.submits = [(100.0, 1.0, 201, None)] * 3 + [(101.0, 30_000.0, -1, None)]
    rec.sent_at = {"a": (100.0, 100.1), "b": (100.0, 100.1), "c": (100.0, 100.1)}
    # a: in time; b: after the horizon (a hung submit kept the run going); d: its client timed out
    rec.succeeded = {"a": horizon - 1, "b": horizon + 1, "d": horizon - 1}
    out = fleet_bench.figures(rec, fleet)
    assert out["completed"] == 0.25 and out["completed_tasks"] == 1
    assert out["succeeded_unanswered"] == 1 and out["timed_out"] == 1


def test_pin_plans_a_core_for_each_server_and_the_rest_for_the_load_generator():
    assert fleet_bench.plan_pins(2, {3, 0, 5, 1}) == ([{0}, {1}], {3, 5})
    assert fleet_bench.plan_pins(1, {0, 1}) == ([{0}], {1})


@pytest.mark.integration
def test_pin_moves_every_thread_of_a_running_process():
    # A process with a second thread, both already running when it is pinned.
    child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
                              "print('ready', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        core = min(os.sched_getaffinity(0))
        fleet_bench.pin(child.pid, {core})
        threads = os.listdir(f"/proc/{child.pid}/task")
        assert len(threads) == 2 and all(os.sched_getaffinity(int(t)) == {core} for t in threads)
    finally:
        child.kill()
        child.wait()


def test_figures_count_tasks_once_and_every_refused_call():
    fleet = fleet_bench.Fleet(["http://x"], gpus=1, shape="gpu", rate=1.0, seconds=10.0, work_s=1.0, heartbeat_s=30,
                              client_retries=True)
    rec = Record(offer_started=100.0)
    # Task a admitted on its third try, b refused until its client gave up, c admitted at once.
    rec.retried = [(100.0, 5.0, 429, 1.0), (101.0, 6.0, 429, 1.0), (100.5, 7.0, 429, 1.0)]
    rec.submits = [(102.0, 8.0, 201, None), (101.5, 9.0, 429, 29.0), (100.2, 4.0, 201, None)]
    rec.sent_at = {"a": (100.0, 102.0), "c": (100.2, 100.2)}
    rec.succeeded = {"a": 103.0, "c": 101.0}
    out = fleet_bench.figures(rec, fleet)
    assert out["completed"] == pytest.approx(2 / 3, abs=1e-3) and out["offered_per_s"] == 0.3
    assert out["refused_429"] == 4 and out["never_admitted_429"] == 1
    assert out["submit_max_ms"] == 9.0  # over every call, the retried ones too


def answering(codes: list[tuple[int, str]]):
    """A loopback server whose POST /v1/tasks answers the given (status, Retry-After) in turn."""
    from aiohttp import web

    async def submit(_req):
        status, after = codes.pop(0)
        if status == 201:
            return web.json_response({"id": "t1", "status": "queued"}, status=201)
        return web.json_response({"detail": "busy"}, status=status, headers={"Retry-After": after})

    app = web.Application()
    app.add_routes([web.post("/v1/tasks", submit)])
    return app


async def submit_once(codes: list[tuple[int, str]], client_retries: bool) -> Record:
    import aiohttp
    from aiohttp import web

    runner = web.AppRunner(answering(codes))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    fleet = fleet_bench.Fleet([url], gpus=1, shape="gpu", rate=1.0, seconds=1.0, work_s=1.0, heartbeat_s=30,
                              client_retries=client_retries)
    try:
        async with aiohttp.ClientSession() as http:
            await fleet._submit(http, url, 0)
    finally:
        await runner.cleanup()
    return fleet.rec


@pytest.mark.integration
def test_a_retrying_client_submits_a_refused_task_again_after_its_retry_after():
    rec = asyncio.run(submit_once([(429, "0"), (429, "0"), (201, "")], client_retries=True))
    assert [c[2] for c in rec.retried] == [429, 429] and [c[2] for c in rec.submits] == [201]
    first, _ = rec.sent_at["t1"]
    assert first == rec.retried[0][0]  # its wait counts from the first try, as its client saw it


@pytest.mark.integration
def test_a_client_without_retries_or_past_its_30_s_leaves_a_refused_task():
    rec = asyncio.run(submit_once([(429, "0"), (201, "")], client_retries=False))
    assert rec.retried == [] and [(c[2], c[3]) for c in rec.submits] == [(429, 0.0)] and rec.sent_at == {}
    rec = asyncio.run(submit_once([(429, "31")], client_retries=True))  # the retry would come too late
    assert rec.retried == [] and [(c[2], c[3]) for c in rec.submits] == [(429, 31.0)] and rec.sent_at == {}


def test_each_store_runs_routed_then_blind_with_adapters_and_the_trivial_server_routed_only():
    class Args:
        adapter_sets, held, adapter_load_s = 5, 2, 0.5
    assert fleet_bench.routes(type("A", (), {"adapter_sets": 0}), "sqlite") == [None]
    routed, blind = fleet_bench.routes(Args, "sqlite")
    assert (routed.say, blind.say) == (True, False) and routed.sets == 5 and blind.held == 2
    assert [p.say for p in fleet_bench.routes(Args, "trivial")] == [True]
    draws = [routed.loras(__import__("random").Random(1))[0]["source"] for _ in range(3)]
    assert all(s.startswith("https://bench.invalid/set-") for s in draws)


@pytest.mark.integration
def test_a_fleet_with_adapters_runs_routed_and_blind_and_counts_the_loads(tmp_path):
    """--adapter-sets: the simulated workers say the sets they hold in their exchanges (the scheduler
    validates them: a malformed key would be a 422 and an error here) and pay --adapter-load-s for a
    set they lack; a routed row and a blind one, each counting its loads."""
    out = tmp_path / "fleet.json"
    assert fleet_bench.main(["--gpus", "8", "--seconds", "2", "--work-s", "0.2", "--stores", "sqlite",
                             "--shapes", "gpu", "--overload-gpus", "0", "--adapter-sets", "3", "--held", "1",
                             "--adapter-load-s", "0.05", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["adapter_sets"] == 3
    rows = report["rows"]
    assert [r["adapters"]["route"] for r in rows] == ["routed", "blind"]
    for row in rows:
        assert row["errors"] == [] and row["completed"] >= 0.9 and row["timed_out"] == 0
        a = row["adapters"]
        assert a["tasks"] >= row["completed_tasks"] > 0  # every task brought a set (tasks in flight counted too)
        assert 0 < a["loads_per_100_tasks"] <= 100  # each worker's first task of a set loads it
