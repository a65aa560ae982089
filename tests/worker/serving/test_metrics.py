"""Rank 0's metrics: the heartbeat's counters and /metrics come from one tally (the ledger's), the
stage histograms from each reported task's timings; GPU figures from NVML (a fake here: no GPU)."""

from __future__ import annotations

import types
from concurrent.futures import ThreadPoolExecutor

import torch
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client import generate_latest

from protocol import DeviceInfo, ErrorCode, ReportOutcome, TaskResult
from worker.serving.ledger import Counter, Ledger, Stage
from worker.serving.metrics import Metrics
from worker.serving.reporter import Reporter
from worker.serving.results import failure
from worker.serving.state import WorkerState
from tests.worker.serving.test_reporter import RecordingClient, backlog_of, task


def scrape(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    """Every sample by (name, sorted labels), as Prometheus would parse the exposition."""
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_outcomes_and_refusals_are_the_heartbeats_counters():
    state, ledger = WorkerState(warnings=["image check off"]), Ledger()
    metrics = Metrics(state, ledger, torch.device("cpu"), process=False)
    tally = ledger.counters
    tally.add(Counter.TASKS_SUCCEEDED, 3)
    tally.add(Counter.TASKS_FAILED, 2)
    tally.failed(ErrorCode.UNSAFE_PROMPT)
    tally.failed(ErrorCode.UNSAFE_PROMPT)
    tally.add(Counter.PROMPTS_REFUSED, 2)
    tally.add(Counter.IMAGES_REFUSED)
    tally.add(Counter.HEARTBEAT_FAILURES)
    state.set_status("ready")
    got = scrape(metrics)
    counters = tally.as_wire()  # the heartbeat's
    assert got[("dit_worker_tasks_total", (("outcome", "succeeded"),))] == counters["tasks_succeeded"] == 3
    assert got[("dit_worker_tasks_total", (("outcome", "failed"),))] == 2
    assert got[("dit_worker_task_failures_total", (("code", "unsafe_prompt"),))] == 2
    assert got[("dit_worker_refusals_total", (("check", "text"),))] == 2
    assert got[("dit_worker_refusals_total", (("check", "image"),))] == 1
    assert got[("dit_worker_heartbeat_failures_total", ())] == 1
    assert got[("dit_worker_status", (("status", "ready"),))] == 1
    assert got[("dit_worker_status", (("status", "draining"),))] == 0
    assert got[("dit_worker_warnings", (("warning", "image check off"),))] == 1


def test_a_reported_task_feeds_the_stage_histograms_and_its_error_code():
    ledger = Ledger()
    metrics = Metrics(WorkerState(), ledger, torch.device("cpu"), process=False)
    reporter = backlog_of(RecordingClient(), ledger, metrics=metrics)
    ok, bad = task("a"), task("b")
    ok.timings.record(lease=5.0, denoise=900.0, vae=120.0, store=30.0, not_a_stage=1.0)
    bad.timings.record(lease=5.0, text_check=2.0)
    pool = ThreadPoolExecutor(1)
    result = TaskResult(uri="file:///a.png", content_type="image/png", width=64, height=64, seed=1, bytes=1, sha256="0")
    reporter.add(ok, pool.submit(lambda: result))
    reporter.add(bad, pool.submit(lambda: failure(ErrorCode.UNSAFE_PROMPT, "no", retryable=False)))
    reporter.report_down_to(0, keepalive=lambda: None, every_s=0.05)
    got = scrape(metrics)
    count = {stage: got.get(("dit_worker_stage_seconds_count", (("stage", stage),)), 0)
             for stage in ("lease", "denoise", "vae", "store", "text_check", "report", "not_a_stage")}
    assert count == {"lease": 2, "denoise": 1, "vae": 1, "store": 1, "text_check": 1, "report": 2, "not_a_stage": 0}
    assert got[("dit_worker_stage_seconds_sum", (("stage", "denoise"),))] == 0.9
    # 0.9 s lies in the 1 s bucket, not in the 0.5 s one
    assert got[("dit_worker_stage_seconds_bucket", (("le", "1.0"), ("stage", "denoise")))] == 1
    assert got[("dit_worker_stage_seconds_bucket", (("le", "0.5"), ("stage", "denoise")))] == 0
    assert got[("dit_worker_task_failures_total", (("code", "unsafe_prompt"),))] == 1
    assert ledger.counters.as_wire()["failed.unsafe_prompt"] == 1


def test_lost_leases_are_counted_once_whether_the_heartbeat_or_a_report_finds_them():
    ledger = Ledger()
    metrics = Metrics(WorkerState(), ledger, torch.device("cpu"), process=False)
    a, b = task("a"), task("b")
    ledger.hold(a, Stage.GENERATE)
    ledger.hold(b, Stage.GENERATE)
    ledger.mark_lost(["a"])
    ledger.mark_lost(["a", "unknown"])  # told again, and about a task it does not hold: not counted
    client = RecordingClient()
    client.report_many = lambda reports, deadline_s: [
        ReportOutcome(task_id=r.task_id, status_code=409, detail="stale") for r in reports]
    reporter = Reporter(client, lambda: "w-1", ledger, deadline_s=1.0)
    reporter.processing_all([b, task("c")])
    assert scrape(metrics)[("dit_worker_leases_lost_total", ())] == 3  # a, then b and c refused


def test_batch_sizes_are_a_histogram():
    metrics = Metrics(WorkerState(), Ledger(), torch.device("cpu"), process=False)
    metrics.round_generated([4, 4, 1])
    got = scrape(metrics)
    assert got[("dit_worker_batch_size_count", ())] == 3 and got[("dit_worker_batch_size_sum", ())] == 9


class FakeNvml:
    """pynvml's surface as the collector uses it: one GPU on this host, one on another."""

    class NVMLError(Exception):
        pass

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2
    nvmlClocksEventReasonHwThermalSlowdown, nvmlClocksEventReasonSwThermalSlowdown = 0x40, 0x20
    nvmlClocksEventReasonSwPowerCap, nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x4, 0x80

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid != "GPU-aaaa":
            raise self.NVMLError("not found")
        return "h0"

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 83

    def nvmlDeviceGetPowerUsage(self, h):
        return 612_500  # mW

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=97)

    def nvmlDeviceGetMemoryInfo(self, h):
        raise self.NVMLError("not supported")  # left out, never a made-up 0

    def nvmlDeviceGetClockInfo(self, h, clock):
        return {1: 1755, 2: 2619}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x40 | 0x1


def test_gpu_figures_per_rank_for_this_hosts_devices_from_nvml():
    metrics = Metrics(WorkerState(), Ledger(), torch.device("cpu"), process=False)
    devices = [DeviceInfo(name="H100", memory_bytes=1, uuid="aaaa"), DeviceInfo(name="H100", memory_bytes=1, uuid="bbbb")]
    metrics.watch_gpus(devices, nvml=FakeNvml())
    got = scrape(metrics)
    gpu = (("gpu", "GPU-aaaa"), ("rank", "0"))
    assert got[("dit_worker_gpu_temperature_celsius", gpu)] == 83
    assert got[("dit_worker_gpu_power_watts", gpu)] == 612.5
    assert got[("dit_worker_gpu_utilization_ratio", gpu)] == 0.97
    assert got[("dit_worker_gpu_clock_hertz", tuple(sorted((*gpu, ("clock", "sm")))))] == 1755e6
    assert got[("dit_worker_gpu_throttled", tuple(sorted((*gpu, ("reason", "hw_thermal")))))] == 1
    assert got[("dit_worker_gpu_throttled", tuple(sorted((*gpu, ("reason", "power_cap")))))] == 0
    assert not any(name == "dit_worker_gpu_memory_used_bytes" for name, _ in got)
    assert not any(dict(labels).get("gpu") == "GPU-bbbb" for _, labels in got)  # on another host


def test_no_gpu_metrics_without_nvml_or_without_gpus():
    metrics = Metrics(WorkerState(), Ledger(), torch.device("cpu"), process=False)
    metrics.watch_gpus([DeviceInfo(name="cpu", memory_bytes=1)])  # CPU ranks: NVML never asked
    broken = FakeNvml()
    broken.nvmlInit = lambda: (_ for _ in ()).throw(broken.NVMLError("NVML Shared Library Not Found"))
    metrics.watch_gpus([DeviceInfo(name="H100", memory_bytes=1, uuid="aaaa")], nvml=broken)
    assert not any(name.startswith("dit_worker_gpu_") for name, _ in scrape(metrics))
