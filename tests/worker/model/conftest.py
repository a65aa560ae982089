"""A small module compiled for real in a fresh process, as a restarted worker compiles: once cold
for the session, copied by each test that needs a cache a first process left."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from launch.local import REPO

COMPILE = textwrap.dedent("""
    import logging, sys, torch
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from worker.model.compile_cache import CompileCache
    from worker.model.engine import Engine
    cache = CompileCache.open(sys.argv[1], torch.device("cpu"))
    class Net(torch.nn.Module):  # a forward of its own: dynamo skips torch's own modules' frames
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

        def forward(self, x):
            return self.b(torch.nn.functional.gelu(self.a(x)))

    torch.manual_seed(0)
    net = Net().eval()
    net.compile(fullgraph=True, dynamic=False)  # as the engine compiles the transformer
    engine = Engine(None, None, torch.device("cpu"), compile_cache=cache)  # its compile-failure handling
    with torch.no_grad():
        y = engine._compiling(lambda: net(torch.ones(4, 16)))
    print("RESULT", round(float(y.sum()), 5), cache.stats())
""")


def run_compile(root) -> tuple[str, str]:
    """The printed result (numbers and cache hits) and the log of one fresh process."""
    proc = subprocess.run([sys.executable, "-c", COMPILE, str(root)], cwd=REPO, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split("RESULT ")[1].strip(), proc.stderr


@pytest.fixture
def compile_in_a_new_process():
    return run_compile


@pytest.fixture(scope="session")
def compiled_once(tmp_path_factory):
    """One cold compile for the tests that need a cache a first process left (copy it, then use it)."""
    root = tmp_path_factory.mktemp("compile-cache")
    result, _ = run_compile(root)
    return root, result
