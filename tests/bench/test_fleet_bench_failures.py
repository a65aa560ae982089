"""`make bench-fleet` refusals: settings this machine cannot honour are named before any row runs."""

from __future__ import annotations

import pytest

from bench import fleet as fleet_bench


def test_pin_without_a_core_left_for_the_load_generator_names_the_flag():
    with pytest.raises(SystemExit, match=r"--pin needs a core for each of the 2 server process\(es\) and one for "
                                         r"the load generator; this process may use 2"):
        fleet_bench.plan_pins(2, {0, 1})


def test_pin_is_refused_at_start_when_a_row_would_need_more_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(fleet_bench.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(fleet_bench, "run_row", lambda *a, **k: pytest.fail("a row ran"))
    with pytest.raises(SystemExit, match="--pin needs a core for each of the 2 server"):
        fleet_bench.main(["--stores", "sqlite,postgres-2", "--pin", "--out", str(tmp_path / "f.json")])


def test_adapter_sets_with_the_separate_calls_are_refused_naming_the_protocol(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fleet_bench, "run_row", lambda *a, **k: pytest.fail("a row ran"))
    with pytest.raises(SystemExit):
        fleet_bench.main(["--adapter-sets", "4", "--protocol", "calls", "--out", str(tmp_path / "f.json")])
    err = capsys.readouterr().err
    assert "--adapter-sets" in err and "use --protocol exchange" in err
