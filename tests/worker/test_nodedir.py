"""What node.sh and its ranks share across group restarts (worker/nodedir.py)."""

from __future__ import annotations

from worker.nodedir import Fatal, NodeDir


def test_an_empty_directory_says_nothing(tmp_path):
    node = NodeDir(tmp_path)
    assert not node.stop_requested() and node.fatal() is None


def test_the_first_fatal_error_is_kept_on_one_line_for_node_sh(tmp_path):
    node = NodeDir(tmp_path)
    node.record_fatal(2, "config error: queue.lease_wiat_s:\n  unknown key")
    node.record_fatal(1, "a later rank's own failure")
    assert node.fatal() == Fatal(2, "config error: queue.lease_wiat_s: unknown key")
    assert (tmp_path / "fatal").read_text() == "2\nconfig error: queue.lease_wiat_s: unknown key\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fatal"]  # no temporary file left behind


def test_a_stop_is_a_file_node_sh_creates(tmp_path):
    (tmp_path / "stop").touch()
    assert NodeDir(tmp_path).stop_requested()


def test_drained_is_recorded_once(tmp_path):
    node = NodeDir(tmp_path)
    node.record_drained()
    node.record_drained()
    assert (tmp_path / "drained").exists()
