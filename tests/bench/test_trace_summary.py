"""bench.worker.profile.summarize_trace on a hand-made trace: the GPU's busy time is the union of
every stream's kernels, gaps are what no kernel covers, threads count nested operators once."""

from __future__ import annotations

import gzip
import json

from bench.worker.profile import summarize_trace


def _kernel(ts, dur, stream, name="k"):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def _op(ts, dur, tid, name="aten::mm"):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid}


def test_busy_time_gaps_streams_and_threads(tmp_path):
    events = [
        {"ph": "M", "name": "thread_name", "tid": 1, "args": {"name": "serve loop"}},
        _op(0, 10_000, 1), _op(1_000, 2_000, 1, "aten::addmm"),  # nested: 10 ms on thread 1
        _op(20_000, 1_000, 2, "aten::softmax"),
        _kernel(0, 4_000, 7, "gemm"), _kernel(2_000, 4_000, 13, "vit"),  # overlap on two streams: 6 ms
        _kernel(9_000, 1_000, 7, "gemm"),  # a 3 ms gap before it
        _kernel(10_000, 500, 7, "gemm"),
        # the window ends at 21 ms (thread 2's op): a 10.5 ms gap at the end
    ]
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    s = summarize_trace(path)
    assert s["window_ms"] == 21.0
    assert s["gpu_busy_ms"] == 7.5 and s["gpu_busy_share"] == round(7.5 / 21, 4)
    assert s["gpu_idle_gaps"]["largest_ms"] == [10.5, 3.0] and s["gpu_idle_gaps"]["over_1ms"] == 2
    assert s["streams"]["7"]["kernels"] == 3 and s["streams"]["7"]["busy_ms"] == 5.5
    assert s["streams"]["13"]["top"] == [{"name": "vit", "calls": 1, "ms": 4.0}]
    assert s["threads"]["serve loop"]["busy_ms"] == 10.0 and s["threads"]["2"]["busy_ms"] == 1.0
