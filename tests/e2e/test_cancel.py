"""End to end: cancel while queued, while leased but not started, and while generating, against a
2-rank worker; each ends `cancelled` with no object stored, no success accepted, and the worker goes on
serving. Cancelling a finished task answers 409 and changes nothing."""

from __future__ import annotations

import psutil
import pytest

from launch.local import wait_until
from tests.harness import rank_pid, ready_worker, run, settled_worker

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


@pytest.mark.parametrize("exchange", [False, True], ids=["calls", "exchange"])
def test_cancel_while_queued_leased_and_generating(stack, exchange):
    # With the exchange, the admission's `processing` reports wait for the next call (at most
    # queue.lease_hold_s, 2 s) and the answers carry the cancel notices too.
    stack.proc = stack.worker(nproc=2, overrides=["queue.lease_ahead=4", f"queue.exchange={str(exchange).lower()}"])
    ready_worker(stack, stack.proc)
    # Rank 1 frozen (SIGSTOP): the first round stays in generation, deterministically, until it thaws.
    follower = psutil.Process(rank_pid(stack.proc, 1))
    follower.suspend()
    http = stack.client.http
    inputs = [{"input": {"prompt": f"a lighthouse {i}", "width": 256, "height": 256}} for i in range(6)]
    ids = [stack.client.submit(inputs[0]["input"])["id"]]

    def statuses():
        return [stack.client.task(t)["status"] for t in ids]

    # The first task alone makes the first round, which stays in generation; then the worker holds
    # four more (lease_ahead) waiting for the next round, and the last stays queued.
    wait_until(lambda: statuses() == ["processing"], 60, "the first round", stack.proc)
    ids += [t["id"] for t in http.post("/v1/tasks/batch", json={"tasks": inputs[1:]}).json()["tasks"]]
    wait_until(lambda: statuses() == ["processing"] * 5 + ["queued"], 60, "four tasks admitted", stack.proc)
    picks = {"generating": ids[0], "waiting": ids[2], "queued": ids[5]}
    answers = {why: http.post(f"/v1/tasks/{t}/cancel") for why, t in picks.items()}
    assert all(r.status_code == 200 for r in answers.values())
    assert answers["queued"].json()["status"] == "cancelled"
    assert answers["generating"].json()["cancel_requested_at"] is not None
    settled_worker(stack, beats=2)  # its heartbeat replies named the two cancelled tasks
    follower.resume()

    done = stack.client.wait(ids, 180, until=("succeeded", "failed", "cancelled"), proc=stack.proc)
    for why, t in picks.items():
        task = done[t]
        assert task["status"] == "cancelled" and task["result"] is None, (why, task)
        assert task["error"]["code"] == "cancelled"
    assert "before it started" in done[picks["waiting"]]["error"]["message"]
    assert "discarded" in done[picks["generating"]]["error"]["message"]
    others = [t for t in ids if t not in picks.values()]
    assert all(done[t]["status"] == "succeeded" for t in others)
    stored = {p.stem for p in stack.objects()}
    assert stored == set(others)  # no object for a cancelled task

    # The worker goes on serving; a finished task cannot be cancelled and does not change.
    (after,) = run(stack, [{"prompt": "still serving", "width": 256, "height": 256}])
    assert after["status"] == "succeeded"
    refused = http.post(f"/v1/tasks/{after['id']}/cancel")
    assert refused.status_code == 409 and stack.client.task(after["id"]) == after
