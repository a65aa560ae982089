"""The entry point's start and stop rules: start errors recorded for node.sh, a stop signal that
arrives several times at once counted once."""

from __future__ import annotations

import signal

import pytest

from worker.main import EXIT_PERMANENT, StopSignals, run
from worker.nodedir import NodeDir


class FakeCoordinator:
    def __init__(self) -> None:
        self.stops = 0

    def request_stop(self) -> None:
        self.stops += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_stop_delivered_several_times_at_once_is_one_drain():
    """SLURM signals every process of the step, and torchrun forwards what it got: rank 0 sees the
    same stop two or three times within milliseconds."""
    coordinator, clock, exits = FakeCoordinator(), Clock(), []
    stop = StopSignals(coordinator, same_stop_s=1.0, clock=clock, exit=exits.append)
    stop.on_signal(signal.SIGTERM)
    clock.now += 0.01
    stop.on_signal(signal.SIGTERM)
    stop.on_signal(signal.SIGINT)
    assert coordinator.stops == 1 and exits == []


def test_a_later_signal_stops_at_once():
    coordinator, clock, exits = FakeCoordinator(), Clock(), []
    stop = StopSignals(coordinator, same_stop_s=1.0, clock=clock, exit=exits.append)
    stop.on_signal(signal.SIGINT)
    clock.now += 1.5
    stop.on_signal(signal.SIGINT)
    assert coordinator.stops == 1 and exits == [128 + signal.SIGINT]


def test_followers_leave_stopping_to_the_coordinator():
    exits = []
    StopSignals(None, exit=exits.append).on_signal(signal.SIGTERM)
    assert exits == []


def test_a_config_error_is_recorded_for_node_sh(tmp_path, capsys):
    config = tmp_path / "bad.toml"
    config.write_text("[queue]\nlease_wiat_s = 3\n")
    assert run(str(config), [], str(tmp_path)) == EXIT_PERMANENT
    fatal = NodeDir(tmp_path).fatal()
    assert fatal.code == EXIT_PERMANENT and "lease_wiat_s" in fatal.message
    assert "lease_wiat_s" in capsys.readouterr().err


@pytest.mark.parametrize("left", ["fatal", "stop"])
def test_a_group_started_after_a_fatal_error_or_a_stop_leaves_at_once(tmp_path, capsys, left):
    """Exit 0 on every rank: torchrun ends instead of restarting, and node.sh reports the cause."""
    if left == "fatal":
        NodeDir(tmp_path).record_fatal(EXIT_PERMANENT, "config error: x")
    else:
        (tmp_path / "stop").touch()
    assert run("no-such-config.toml", [], str(tmp_path)) == 0
    assert "not starting:" in capsys.readouterr().err


def test_the_collector_is_off_through_start_up_and_on_again_whatever_ends_it(tmp_path, monkeypatch):
    """Off from the serve command's start; on again when run() returns early (here: a config
    error), and on again, start-up's objects frozen, once the models are loaded."""
    import gc

    from worker import cli, main

    seen = []
    monkeypatch.setattr(main, "run", lambda *a: seen.append(gc.isenabled()) or EXIT_PERMANENT)
    assert cli.main(["serve", "--config", str(tmp_path / "none.toml")]) == EXIT_PERMANENT
    assert seen == [False] and gc.isenabled()

    made = [[i] for i in range(1000)]  # start-up's objects, here
    before = gc.get_freeze_count()
    gc.disable()
    try:
        main._started()
        assert gc.isenabled() and gc.get_freeze_count() >= before + len(made)
    finally:
        gc.enable()
