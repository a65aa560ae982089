"""Rank 0's Prometheus metrics (prometheus-client), served by serving.ops.

Two kinds of source, never two tallies of one thing:
- the counters the heartbeat carries (the ledger's Tally) are read at scrape time by StateCollector,
  so /metrics and GET /v1/workers always agree;
- what the heartbeat does not carry is observed here as it happens: the stage histograms (from each
  reported task's timings record) and batch sizes.
Device memory is read at scrape time; GPU temperature, power, clocks, utilisation and throttling come
from NVML (nvidia-ml-py) for this group's GPUs on this host, where NVML is present.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client import PlatformCollector, ProcessCollector

from protocol import DeviceInfo, RegistrationStatus
from worker.serving.ledger import REPORTED, Counter, Ledger, Tally
from worker.serving.state import WorkerState

log = logging.getLogger(__name__)

# A task's timings record (serving.task.Timings) -> the stage label. Stages shared by a batch hold
# the batch's time, observed once per task.
STAGES = ("lease", "text_check", "admit", "wait", "settle", "swap", "broadcast", "embed", "denoise", "vae", "gather",
          "generate", "image_check", "encode", "store", "report")
SWAP_BUCKETS = (.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, float("inf"))
STAGE_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, float("inf"))
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, float("inf"))

# Heartbeat counters -> (metric, help). Counters are totals since the worker started.
OUTCOMES = {**REPORTED, "cancelled": Counter.TASKS_CANCELLED}
REFUSALS = {Counter.PROMPTS_REFUSED: "text", Counter.IMAGES_REFUSED: "image"}
COUNTERS = {
    Counter.IMAGES_GENERATED: ("dit_worker_images_generated", "Images generated for tasks by every rank of the group"),
    Counter.CORRUPT_OUTPUTS: ("dit_worker_corrupt_outputs", "Images the quality check refused (NaN, blank)"),
    Counter.HEARTBEAT_FAILURES: ("dit_worker_heartbeat_failures", "Heartbeats not delivered after their retries"),
    Counter.LEASES_LOST: ("dit_worker_leases_lost", "Tasks whose lease this worker lost before reporting"),
}
GAUGES = {
    Counter.LEASE_AHEAD: ("dit_worker_lease_ahead", "Tasks this worker may hold ahead of generation"),
    Counter.MAX_PENDING: ("dit_worker_max_pending", "Generated tasks that may wait for their report"),
    Counter.UNREPORTED_MAX: ("dit_worker_unreported_max", "Most generated tasks waiting for their report at once"),
}


class Metrics:
    """The registry /metrics serves, and the observations the heartbeat does not carry."""

    def __init__(self, state: WorkerState, ledger: Ledger, device: torch.device, *, process: bool = True) -> None:
        self.registry = CollectorRegistry()
        self.stage = Histogram("dit_worker_stage_seconds", "Wall time of each stage, per reported task",
                               ["stage"], buckets=STAGE_BUCKETS, registry=self.registry)
        self.batch = Histogram("dit_worker_batch_size", "Images per rank per generation", buckets=BATCH_BUCKETS,
                               registry=self.registry)
        # Several models on one worker: each swap (evict, load, warm up on every rank), by model and outcome.
        self.swaps = Histogram("dit_worker_swap_seconds", "Wall time of each model swap, by model and outcome",
                               ["model", "outcome"], buckets=SWAP_BUCKETS, registry=self.registry)
        self.registry.register(StateCollector(state, ledger))
        self.registry.register(MemoryCollector(device))
        if process:  # resident memory, CPU seconds, open files of rank 0
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)

    def task_reported(self, timings_ms: dict[str, float]) -> None:
        for stage, ms in timings_ms.items():
            if stage in STAGES:
                self.stage.labels(stage).observe(ms / 1e3)

    def swapped(self, model: str, seconds: float, ok: bool) -> None:
        self.swaps.labels(model, "loaded" if ok else "failed").observe(seconds)

    def round_generated(self, batch_sizes: Iterable[int]) -> None:
        for n in batch_sizes:
            self.batch.observe(n)

    def watch_gpus(self, devices: list[DeviceInfo], nvml: Any = None) -> None:
        """GPU figures for this group's devices found on this host (by UUID); nothing without NVML."""
        gpus = GpuCollector.open(devices, nvml)
        if gpus is not None:
            self.registry.register(gpus)


class StateCollector(Collector):
    """The heartbeat's counters and status, read when Prometheus scrapes."""

    def __init__(self, state: WorkerState, ledger: Ledger) -> None:
        self._state = state
        self._ledger = ledger

    def collect(self) -> Iterator[Metric]:
        yield from self._counters(self._ledger.counters)
        yield GaugeMetricFamily("dit_worker_in_flight", "Tasks held whose stage is within its deadline",
                                value=len(self._ledger.in_flight()))
        status = GaugeMetricFamily("dit_worker_status", "1 for the status the worker reports", labels=["status"])
        for s in (RegistrationStatus.INITIALIZING, RegistrationStatus.READY, RegistrationStatus.DRAINING):
            status.add_metric([s], float(self._state.status == s))
        yield status
        warnings = GaugeMetricFamily("dit_worker_warnings", "Safety checks switched off by config, and the like",
                                     labels=["warning"])
        for w in self._state.warnings:
            warnings.add_metric([w], 1)
        yield warnings

    def _counters(self, tally: Tally) -> Iterator[Metric]:
        tasks = CounterMetricFamily("dit_worker_tasks", "Tasks reported, by outcome", labels=["outcome"])
        for outcome, counter in OUTCOMES.items():
            tasks.add_metric([outcome], tally.get(counter))
        yield tasks
        failures = CounterMetricFamily("dit_worker_task_failures", "Failed tasks reported, by error code",
                                       labels=["code"])
        for code, n in sorted(tally.failures().items()):
            failures.add_metric([code.value], n)
        yield failures
        refusals = CounterMetricFamily("dit_worker_refusals", "Tasks a safety check refused, by check",
                                       labels=["check"])
        for counter, check in REFUSALS.items():
            refusals.add_metric([check], tally.get(counter))
        yield refusals
        for counter, (name, doc) in COUNTERS.items():
            yield CounterMetricFamily(name, doc, value=tally.get(counter))
        yield CounterMetricFamily("dit_worker_report_seconds", "Time spent delivering final reports",
                                  value=tally.get(Counter.REPORT_US_TOTAL) / 1e6)
        for counter, (name, doc) in GAUGES.items():
            yield GaugeMetricFamily(name, doc, value=tally.get(counter))


class MemoryCollector(Collector):
    """Rank 0's device memory: allocated by tensors (used) and held by the caching allocator."""

    def __init__(self, device: torch.device) -> None:
        self._device = device

    def collect(self) -> Iterator[Metric]:
        if self._device.type != "cuda":
            return
        mem = GaugeMetricFamily("dit_worker_device_memory_bytes", "Rank 0's device memory", labels=["kind"])
        mem.add_metric(["used"], torch.cuda.memory_allocated(self._device))
        mem.add_metric(["reserved"], torch.cuda.memory_reserved(self._device))
        mem.add_metric(["peak"], torch.cuda.max_memory_allocated(self._device))
        yield mem


# NVML's clock event reasons worth an alert: seed 000's throttling cost 15-25% unnoticed.
THROTTLE_REASONS = {"hw_thermal": "nvmlClocksEventReasonHwThermalSlowdown",
                    "sw_thermal": "nvmlClocksEventReasonSwThermalSlowdown",
                    "power_cap": "nvmlClocksEventReasonSwPowerCap",
                    "power_brake": "nvmlClocksEventReasonHwPowerBrakeSlowdown"}


class GpuCollector(Collector):
    """Per GPU of this group on this host, labelled with its rank and UUID. A reading NVML refuses
    (not supported on this board) is left out, never reported as 0."""

    def __init__(self, nvml: Any, handles: list[tuple[str, str, Any]]) -> None:
        self._nvml = nvml
        self._handles = handles  # (rank, uuid, handle)

    @classmethod
    def open(cls, devices: list[DeviceInfo], nvml: Any = None) -> "GpuCollector | None":
        if not any(d.uuid for d in devices):
            return None
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
        except Exception as e:  # no driver, no library: the rest of /metrics still works
            log.info("no GPU metrics: NVML unavailable (%s)", e)
            return None
        handles = []
        for rank, d in enumerate(devices):
            if not d.uuid:
                continue
            uuid = d.uuid if d.uuid.startswith("GPU-") else f"GPU-{d.uuid}"
            try:
                handles.append((str(rank), uuid, nvml.nvmlDeviceGetHandleByUUID(uuid)))
            except nvml.NVMLError:
                pass  # on another node of a multi-node group: its own rank 0 does not see it either
        log.info("GPU metrics for %d of %d device(s) of this group", len(handles), len(devices))
        return cls(nvml, handles)

    def collect(self) -> Iterator[Metric]:
        n = self._nvml
        labels = ["rank", "gpu"]
        families = {
            "temp": GaugeMetricFamily("dit_worker_gpu_temperature_celsius", "GPU core temperature", labels=labels),
            "power": GaugeMetricFamily("dit_worker_gpu_power_watts", "GPU power draw", labels=labels),
            "util": GaugeMetricFamily("dit_worker_gpu_utilization_ratio", "Time a kernel ran, last sample period",
                                      labels=labels),
            "clock": GaugeMetricFamily("dit_worker_gpu_clock_hertz", "Current clock", labels=[*labels, "clock"]),
            "mem": GaugeMetricFamily("dit_worker_gpu_memory_used_bytes", "GPU memory used, all processes",
                                     labels=labels),
            "throttle": GaugeMetricFamily("dit_worker_gpu_throttled", "1 while clocks are held down for this reason",
                                          labels=[*labels, "reason"]),
        }
        for rank, uuid, h in self._handles:
            ids = [rank, uuid]
            self._read(families["temp"], ids, lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
            self._read(families["power"], ids, lambda: n.nvmlDeviceGetPowerUsage(h) / 1e3)
            self._read(families["util"], ids, lambda: n.nvmlDeviceGetUtilizationRates(h).gpu / 100)
            self._read(families["mem"], ids, lambda: n.nvmlDeviceGetMemoryInfo(h).used)
            for clock, const in (("sm", n.NVML_CLOCK_SM), ("memory", n.NVML_CLOCK_MEM)):
                self._read(families["clock"], [*ids, clock], lambda: n.nvmlDeviceGetClockInfo(h, const) * 1e6)
            reasons = self._value(lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))
            if reasons is not None:
                for name, const in THROTTLE_REASONS.items():
                    families["throttle"].add_metric([*ids, name], float(bool(reasons & getattr(n, const))))
        yield from families.values()

    def _read(self, family: GaugeMetricFamily, labels: list[str], read: Callable[[], float]) -> None:
        value = self._value(read)
        if value is not None:
            family.add_metric(labels, value)

    def _value(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except self._nvml.NVMLError:
            return None
