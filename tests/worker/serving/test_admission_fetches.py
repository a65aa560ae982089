"""Adapters fetched beside admission: a task whose adapters are in the node's cache is admitted
with its lease call; one whose adapters must be downloaded is fetched on the pool and joins the
ready tasks when its files are there, so a slow download holds that task alone, never the others
of its lease; a download that fails fails its task only (retryable when the host did not answer),
and the task sits in the `fetch` stage, under its own deadline, meanwhile."""

from __future__ import annotations

import threading

from protocol import ErrorCode
from tests.worker.serving.test_admission import admission, task
from worker.adapters import AdapterUnavailable, CachedAdapter
from worker.config import LoraConfig
from worker.serving.ledger import Stage

SLOW, FAST = "https://hub.example/loras/slow.safetensors", "https://hub.example/loras/fast.safetensors"
DOWN = "https://hub.example/loras/down.safetensors"


class FakeCache:
    """The node's cache: FAST is there; SLOW downloads until `release` is set; DOWN never answers."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.fetched: list[str] = []

    def has(self, source, sha256=None) -> bool:
        return source.url == FAST

    def get(self, source, sha256=None) -> CachedAdapter:
        if source.url == DOWN:
            raise AdapterUnavailable(f"{source.field}: {source.url}: no answer")
        if source.url == SLOW:
            assert self.release.wait(10)
            self.fetched.append(source.url)
        return CachedAdapter(source.url[-20:].rjust(64, "0"), None, 1, 4)


def stage(gate, task_id: str) -> Stage:
    return {h.task.id: h.stage for h in gate.ledger.held()}[task_id]


def gate_with_cache():
    gate, _, reporter = admission()
    gate.lora = LoraConfig(allow=("https://hub.example/loras/",), fetches=2)
    gate.adapters = FakeCache()
    gate.__post_init__()
    later: list[list[str]] = []
    done = threading.Event()
    gate.on_ready = lambda tasks: (later.append([t.id for t in tasks]), done.set())
    return gate, reporter, later, done


def test_a_slow_download_holds_its_own_task_alone():
    gate, reporter, later, done = gate_with_cache()
    tasks = [task("slow", prompt="a fox", loras=[{"source": SLOW}]), task("plain", prompt="a heron"),
             task("cached", prompt="an owl", loras=[{"source": FAST}])]
    admitted = gate.admit(tasks)
    assert [t.id for t in admitted] == ["plain", "cached"]  # at once, while slow downloads
    assert gate.pending() == 1 and stage(gate, 'slow') is Stage.FETCH
    gate.adapters.release.set()
    assert done.wait(10)
    assert later == [["slow"]] and gate.pending() == 0
    assert reporter.processing == [["plain", "cached"], ["slow"]]
    assert tasks[0].job.loras[0].sha256.endswith("slow.safetensors"[-20:])
    assert stage(gate, 'slow') is Stage.READY


def test_a_download_that_fails_fails_its_task_only():
    gate, reporter, later, done = gate_with_cache()
    tasks = [task("down", prompt="a fox", loras=[{"source": DOWN}]), task("plain", prompt="a heron")]
    assert [t.id for t in gate.admit(tasks)] == ["plain"]
    assert done.wait(10)
    assert later == [[]] and reporter.failed == {"down": ErrorCode.ADAPTER_UNAVAILABLE}
    assert reporter.retryable == {"down": True} and gate.pending() == 0
