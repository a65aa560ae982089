"""`dit models` and `dit submit --model` against a real scheduler serving two models."""

from __future__ import annotations

import json

import pytest

from launch.local import free_port, start_scheduler
from tests.client.test_cli import dit

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli-models")
    port = free_port()
    proc = start_scheduler(tmp / "s.db", port, tmp / "s.log",
                           extra=["--set", 'models.ids=["flux", "pixart"]', "--set", "models.cold_wait_s=5"])
    yield f"http://127.0.0.1:{port}"
    proc.stop()


def test_submit_names_a_model_and_models_lists_each_ones_queue(url):
    named = dit(url, "submit", "a fox", "--model", "pixart")
    default = dit(url, "submit", "a fox")
    assert named.returncode == default.returncode == 0, named.stderr + default.stderr
    lines = dit(url, "models").stdout.splitlines()
    assert lines[0].split() == ["MODEL", "QUEUED", "OLDEST", "RUNNING", "WARM", "LOADABLE"]
    assert lines[1].split()[:2] == ["flux", "1"] and lines[1].endswith("(default)")
    assert lines[2].split()[:2] == ["pixart", "1"]
    view = json.loads(dit(url, "models", "--json").stdout)
    assert view["cold_wait_s"] == 5.0 and view["models"]["pixart"]["warm_workers"] == 0
