"""launch/node.sh as operators run it: serves, drains on SIGTERM, Ctrl-C or a signal to torchrun
itself and reports the drain as success, keeps a stop that arrives while torchrun restarts the
group, and ends once, with the error, on a start error no restart can cure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from launch.local import REPO, free_port, messages, wait_until
from tests.harness import TINY_CONFIG, rank_pid, ready_worker, run

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

FINAL = ("succeeded", "failed", "cancelled")


def test_node_sh_serves_then_a_sigterm_drain_exits_0(make_stack):
    stack = make_stack()
    proc = stack.node(nproc=2)
    ready_worker(stack, proc)
    [task] = run(stack, [{"prompt": "through node.sh"}], proc=proc)
    assert task["status"] == "succeeded"
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.wait(90) == 0, proc.output()[-3000:]
    out = proc.output()
    assert "node.sh: draining" in out and "follower stopped: drained" in out
    assert "Traceback" not in out and "SignalException" not in out
    assert "OMP_NUM_THREADS" not in out  # set by node.sh, so torchrun has nothing to warn about
    # It said so before exiting: shown drained, not draining, and never lost once its beats stop.
    [worker] = stack.registered()
    assert worker["status"] == "drained" and f"told the scheduler that worker {worker['id']} drained" in out


def test_a_bf16_model_on_device_auto_without_cuda_is_refused_at_start(tmp_path):
    # configs/flux-schnell.toml asks for bfloat16 FLUX on device "auto"; this machine has no CUDA.
    out = subprocess.run([sys.executable, "-m", "worker", "--config", str(REPO / "configs" / "flux-schnell.toml")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 2, out.stderr[-2000:]
    said = messages(out.stderr)
    assert "not starting: model.device: 'auto' found no CUDA device" in said
    assert 'set model.device = "cpu"' in said


def node_sh(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONFIG": str(TINY_CONFIG), "NPROC": "2",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", str(REPO / "launch" / "node.sh"), *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)


def test_a_config_typo_ends_the_node_once_before_torchrun_starts():
    out = node_sh("--set", "queue.lease_wiat_s=3")
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.count("lease_wiat_s") == 1 and "unknown key" in out.stderr
    assert "torch.distributed" not in out.stderr and "Restarting" not in out.stderr


def test_a_start_error_a_rank_finds_ends_the_node_after_one_restart(make_stack):
    """The local store cannot be written: rank 0 finds it after torchrun started the group. The
    group restarted for it leaves at once, so node.sh exits 2 instead of restarting for ever. One
    rank: the restart is torchrun's, the way out node.sh's."""
    stack = make_stack()
    proc = stack.node(nproc=1, overrides=["storage.local.root=/proc/dit-worker-cannot-write"])
    assert proc.wait(120) == 2, proc.output()[-3000:]
    said = proc.messages()
    assert "node.sh: not restarting: not starting: local.root: cannot write to /proc/dit-worker-cannot-write" in said
    assert said.count("not starting: an earlier start failed for good") == 1  # the one restart
    assert stack.registered() == []


def test_ctrl_c_drains_a_node_with_tasks_in_flight(make_stack):
    """SIGINT to node.sh's process group, as a terminal sends it: torchrun is not in that group, so
    it does not kill the ranks; every task ends or is handed back at once, and the node exits 0."""
    stack = make_stack()
    proc = stack.node(nproc=2)
    ready_worker(stack, proc)
    ids = [stack.client.submit({"prompt": f"ctrl-c {i}"})["id"] for i in range(6)]
    wait_until(lambda: any(stack.client.task(i)["status"] == "processing" for i in ids), 60, "a task in flight", proc)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(90) == 0, proc.output()[-3000:]
    out = proc.output()
    assert "Traceback" not in out and "SignalException" not in out and "gather failed" not in out
    states = [stack.client.task(i)["status"] for i in ids]
    assert all(s in (*FINAL, "queued") for s in states), states  # none left leased until its lease expires
    assert "succeeded" in states


def test_a_stop_while_torchrun_restarts_the_group_is_kept(make_stack):
    """A rank dies and node.sh is stopped at once: the group torchrun starts next must not serve.
    One rank, the one that registered: the restart is torchrun's, the stop node.sh's."""
    stack = make_stack()
    proc = stack.node(nproc=1)
    ready_worker(stack, proc)
    os.kill(rank_pid(proc, 0), signal.SIGKILL)
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.wait(90) == 0, proc.output()[-3000:]
    said = proc.messages()
    assert "node.sh was told to stop while the group restarted" in said
    assert len(stack.registered()) == 1  # the restarted group never registered


def test_a_sigterm_to_every_process_of_the_node_as_slurm_sends_it_is_one_drain(make_stack):
    """SLURM's --signal and scancel reach every process of the step: node.sh, torchrun (which forwards
    it again) and each rank. Rank 0 takes the repeats as one stop, torchrun waits DRAIN_S for the
    ranks instead of 30 s, and node.sh reports the drain as success though torchrun exits 1."""
    stack = make_stack()
    proc = stack.node(nproc=2)
    ready_worker(stack, proc)
    [task] = run(stack, [{"prompt": "before the stop"}], proc=proc)
    assert task["status"] == "succeeded"
    node = psutil.Process(proc.pid)
    for p in [node, *node.children(recursive=True)]:
        p.send_signal(signal.SIGTERM)
    assert proc.wait(90) == 0, proc.output()[-3000:]
    said = proc.messages()
    assert "node.sh: the ranks drained cleanly" in said and "follower stopped: drained" in said
    assert stack.registered()[0]["status"] == "drained"


def test_a_node_waiting_for_a_scheduler_that_does_not_answer_stops_on_ctrl_c(make_stack):
    """Registration retries name the URL; Ctrl-C ends them at once, without a traceback."""
    stack = make_stack()
    nowhere = f"http://127.0.0.1:{free_port()}"
    proc = stack.node(nproc=1, overrides=[f"queue.url={nowhere}"])  # rank 0 registers; one is enough
    wait_until(lambda: f"the scheduler at {nowhere} did not answer" in proc.messages(), 120, "a retry", proc)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(60) == 0, proc.output()[-3000:]
    said = proc.messages()
    assert "stopped before serving" in said and "Traceback" not in said
