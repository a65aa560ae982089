"""launch/node.sh as operators run it: serves, drains on SIGTERM and reports the drain as success;
a production config on a machine without CUDA is refused at start."""

from __future__ import annotations

import signal
import subprocess
import sys

from launch.local import REPO, messages
from tests.harness import ready_worker, run


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
    assert stack.registered()[0]["status"] == "draining"


def test_a_bf16_model_on_device_auto_without_cuda_is_refused_at_start(tmp_path):
    # configs/flux-schnell.toml asks for bfloat16 FLUX on device "auto"; this machine has no CUDA.
    out = subprocess.run([sys.executable, "-m", "worker", "--config", str(REPO / "configs" / "flux-schnell.toml")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 2, out.stderr[-2000:]
    said = messages(out.stderr)
    assert "not starting: model.device: 'auto' found no CUDA device" in said
    assert 'set model.device = "cpu"' in said
