"""Schemathesis (its CLI, as CI tools run it) against the running scheduler's /openapi.json, on both
backends: whatever input it generates, valid or not, no answer is a 5xx."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.harness import ci_size


def test_no_generated_input_gets_a_5xx(server, tmp_path):
    st = Path(sys.executable).with_name("st")
    run = subprocess.run([str(st), "run", f"{server.base_url}/openapi.json", "--checks", "not_a_server_error",
                          "--max-examples", "15" if ci_size() else "40", "--request-timeout", "30", "--generation-deterministic",
                          "--report", "junit", "--report-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)  # its caches stay there
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]  # non-zero on any failure of the check
    assert "generated" in out and "Failures:" not in out, out[-3000:]
