"""Rank 0's own status only goes forward, as the scheduler's registration lifecycle does: a drain that
began while the model loaded stays a drain when the serve loop starts and says it is ready."""

from __future__ import annotations

from protocol import RegistrationStatus as R
from worker.serving.state import FORWARD, WorkerState


def test_the_status_goes_forward_and_each_change_wakes_the_heartbeat():
    state = WorkerState()
    assert state.status == R.INITIALIZING
    for status in FORWARD[1:]:
        state.changed.clear()
        state.set_status(status)
        assert state.status == status and state.changed.is_set()


def test_a_drain_begun_while_loading_is_not_undone_by_the_serve_loop_starting():
    state = WorkerState()
    state.set_status(R.DRAINING)  # a stop signal while the model loads
    state.changed.clear()
    state.set_status(R.READY)  # the serve loop starts
    assert state.status == R.DRAINING and not state.changed.is_set()
    state.set_status(R.DRAINED)
    state.set_status(R.INITIALIZING)
    assert state.status == R.DRAINED
