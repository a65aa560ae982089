"""tools.call_trace: what counts as a crossing between modules, on functions made in fake modules."""

import sys

from tools.call_trace import Tracer, summary


def _module(name: str, source: str, **names) -> dict:
    scope = {"__name__": name, **names}
    exec(compile(source, f"<{name}>", "exec"), scope)
    return scope


def _traced(fn) -> Tracer:
    tracer = Tracer()
    sys.setprofile(tracer)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return tracer


def test_counts_calls_between_modules_once_the_serve_loop_has_begun():
    ledger = _module("worker.serving.ledger", "def fate(): return 1\ndef _own(): return fate()")
    post = _module("worker.serving.post", "def run():\n    fate(); fate(); _own()\n", fate=ledger["fate"],
                   _own=ledger["_own"])
    coordinator = _module("worker.serving.coordinator", "def serve(): run()", run=post["run"])
    tracer = _traced(coordinator["serve"])
    assert tracer.calls == {("worker.serving.coordinator:serve", "worker.serving.post:run"): 1,
                            ("worker.serving.post:run", "worker.serving.ledger:fate"): 2,
                            ("worker.serving.post:run", "worker.serving.ledger:_own"): 1}
    assert tracer.modules == {"worker.serving.post", "worker.serving.ledger"}


def test_nothing_is_counted_before_the_serve_loop_or_outside_rank_zero():
    model = _module("worker.model.engine", "def load(): return 1")
    ranks = _module("worker.ranks.lockstep", "def step(): load()", load=model["load"])
    tracer = _traced(ranks["step"])  # no serve() yet
    assert not tracer.on and not tracer.calls
    tracer.on = True
    sys.setprofile(tracer)
    try:
        ranks["step"]()
    finally:
        sys.setprofile(None)
    assert not tracer.calls  # neither side in worker.serving
    assert "worker.model.engine" in tracer.modules


def test_summary_counts_module_pairs_and_calls_per_task():
    trace = {"modules": ["worker.serving.a", "worker.serving.b", "safety.guard"],
             "edges": [{"caller": "worker.serving.a:f", "callee": "worker.serving.b:g", "calls": 6},
                       {"caller": "worker.serving.a:h", "callee": "worker.serving.b:g", "calls": 2},
                       {"caller": "worker.serving.b:g", "callee": "safety.guard:check", "calls": 4}]}
    assert summary(trace, tasks=4) == {"tasks": 4, "rank0_modules_entered": 2, "product_modules_entered": 3,
                                       "function_edges": 3, "module_pairs": 2, "calls_per_task": 3.0}
