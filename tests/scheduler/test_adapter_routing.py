"""Tasks with LoRA adapters go to the workers that hold them, on both stores and through the app: a
worker that says it holds a set gets that set's tasks first; a task whose set another live worker
holds is left to it for adapter_wait_s after its submission, then any worker takes it; a set nobody
holds goes to the first worker that asks, which is then taken to hold it, so a second worker leaves
the set's next task (no herd of loads); holds of a worker that left do not count."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from protocol import Heartbeat, SubmitTask, adapter_set_key
from scheduler.app import create_app
from scheduler.config import ApiConfig
from tests.scheduler.test_models import register as register_models
from tests.scheduler.test_store import worker

WAIT = 2.0
INK, FOG = [{"source": "ink", "scale": 0.8}], [{"source": "https://hub.example/loras/fog.safetensors"}]


def submit(store, loras=None, model=None) -> str:
    inp = {"prompt": "p"} | ({"loras": loras} if loras else {})
    return store.tasks.submit(SubmitTask(input=inp, model=model))[0].id


def key(loras) -> str:
    return adapter_set_key(loras)


@pytest.fixture
def fleet(make_store):
    return make_store(adapter_wait_s=WAIT)


def test_the_key_names_a_set_by_its_sources_whatever_their_order_scales_or_repeats():
    assert key([{"source": "b", "scale": 1}, {"source": "a"}]) == key([{"source": "a", "scale": 0.2}, {"source": "b"},
                                                                         {"source": "a"}])
    assert key([{"source": "a"}]) != key([{"source": "a"}, {"source": "b"}])
    assert key([]) == key(None) == key("not a list") == key([{"scale": 1}]) == ""
    assert len(key(INK)) == 16


def test_a_worker_gets_the_tasks_of_the_sets_it_holds_first(fleet):
    w = worker(fleet)
    plain = submit(fleet)
    ink = submit(fleet, INK)
    assert [le.task_id for le in fleet.claims.claim(w, 1, adapters=[key(INK)])] == [ink]  # ahead of an older task
    assert [le.task_id for le in fleet.claims.claim(w, 1, adapters=[key(INK)])] == [plain]


def test_a_set_another_worker_holds_waits_for_it_then_anyone_takes_it(fleet, clock):
    holder, other = worker(fleet), worker(fleet)
    assert fleet.claims.claim(holder, 1, adapters=[key(INK)]) == []  # says what it holds
    ink, plain = submit(fleet, INK), submit(fleet)
    assert [le.task_id for le in fleet.claims.claim(other, 2)] == [plain]  # ink is left to its holder
    clock.now += WAIT
    assert [le.task_id for le in fleet.claims.claim(other, 1)] == [ink]  # it waited adapter_wait_s


def test_a_set_nobody_holds_goes_to_the_first_worker_which_then_holds_it(fleet, clock):
    first, second = worker(fleet), worker(fleet)
    a, b = submit(fleet, FOG), submit(fleet, FOG)
    assert [le.task_id for le in fleet.claims.claim(first, 1)] == [a]
    assert {w.id: w.adapters for w in fleet.workers.workers()} == {first: [key(FOG)], second: []}
    assert fleet.claims.claim(second, 1) == []  # no herd: b waits for the worker loading fog
    assert [le.task_id for le in fleet.claims.claim(first, 1)] == [b]
    c = submit(fleet, FOG)
    clock.now += WAIT
    assert [le.task_id for le in fleet.claims.claim(second, 1)] == [c]


def test_what_a_worker_says_it_holds_replaces_what_it_held(fleet):
    holder, other = worker(fleet), worker(fleet)
    fleet.claims.claim(holder, 1, adapters=[key(INK), key(FOG)])
    fleet.claims.claim(holder, 1, adapters=[key(FOG)])  # ink unloaded
    ink, fog = submit(fleet, INK), submit(fleet, FOG)
    assert [le.task_id for le in fleet.claims.claim(other, 2)] == [ink]
    assert [le.task_id for le in fleet.claims.claim(holder, 2, adapters=[key(FOG)])] == [fog]


def test_the_holds_of_a_worker_that_left_do_not_count(make_store, clock):
    s = make_store(adapter_wait_s=60.0, liveness_s=5.0)
    gone, other = worker(s), worker(s)
    s.claims.claim(gone, 1, adapters=[key(INK)])
    s.workers.heartbeat(gone, Heartbeat(status="draining", timestamp=0))
    s.workers.heartbeat(gone, Heartbeat(status="drained", timestamp=0))
    ink = submit(s, INK)
    assert [le.task_id for le in s.claims.claim(other, 1)] == [ink]


def test_on_a_fleet_of_models_the_model_is_routed_first_then_the_adapters(make_store, clock):
    s = make_store(models=["a", "b"], cold_wait_s=10.0, adapter_wait_s=WAIT)
    holder, other = register_models(s, ["a"]), register_models(s, ["a"])
    s.claims.claim(holder, 1, ["a"], adapters=[key(INK)])
    ink_b, ink_a, plain_a = submit(s, INK, "b"), submit(s, INK, "a"), submit(s, None, "a")
    assert [le.task_id for le in s.claims.claim(other, 3, ["a"])] == [plain_a]
    assert [le.task_id for le in s.claims.claim(holder, 3, ["a"], adapters=[key(INK)])] == [ink_a]
    assert ink_b  # model b: neither holds it, nobody serves it


def test_leases_and_exchanges_carry_the_sets_a_worker_holds(make_store, clock):
    s = make_store(adapter_wait_s=WAIT)
    holder, other = worker(s), worker(s)
    with TestClient(create_app(s, ApiConfig(sweep_interval_s=3600))) as http:
        assert http.post(f"/v1/workers/{holder}/lease", json={"adapters": [key(INK)]}).status_code == 204
        ink = submit(s, INK)
        assert http.post(f"/v1/workers/{other}/exchange", json={"exchange_id": "x1", "max_tasks": 1}).json()[
            "leases"] == []
        got = http.post(f"/v1/workers/{holder}/exchange",
                        json={"exchange_id": "x2", "max_tasks": 1, "adapters": [key(INK)]}).json()["leases"]
        assert [le["task_id"] for le in got] == [ink]
        bad = http.post(f"/v1/workers/{holder}/lease", json={"adapters": ["not a key"]})
        assert bad.status_code == 422 and "adapters" in bad.text


def test_a_worker_that_takes_no_adapters_is_never_given_a_task_with_them(fleet):
    from protocol import RegisterWorker, WorkerLimits

    def with_adapters(n: int | None) -> str:
        limits = None if n is None else WorkerLimits(
            max_prompt_chars=2000, min_side=64, max_side=1024, max_pixels=1024 * 1024, default_width=256,
            default_height=256, max_steps=8, output_formats=["png"], max_adapters=n)
        return fleet.workers.register(RegisterWorker(hostname="h", world_size=1, devices=[], model="m", version="v",
                                                     limits=limits))[0]

    fp8, unsaid, lora = with_adapters(0), with_adapters(None), with_adapters(3)
    ink, plain = submit(fleet, INK), submit(fleet)
    assert [le.task_id for le in fleet.claims.claim(fp8, 2)] == [plain]  # ink would fail there
    assert [le.task_id for le in fleet.claims.claim(lora, 2)] == [ink]
    fog = submit(fleet, FOG)
    assert [le.task_id for le in fleet.claims.claim(unsaid, 1)] == [fog]  # no limits said: anything


@pytest.mark.parametrize("call", ["one", "batch"])
def test_a_long_poll_is_woken_when_a_task_left_to_its_holder_may_go_to_anyone(tmp_path, call):
    """The holder is busy; another worker's long poll is not woken by the submit (the task is not yet
    its to take) and its own next look (lease_poll_s) would come long after adapter_wait_s: a wake-up at
    the end of the wait gives it the task then, not at the end of its poll."""
    import threading
    import time

    from scheduler.config.schema import WaitsConfig
    from scheduler.store import SQLiteStore

    s = SQLiteStore(tmp_path / "s.db", adapter_wait_s=0.3)  # the real clock: the wait really ends
    holder, other = worker(s), worker(s)
    api = ApiConfig(sweep_interval_s=3600, waits=WaitsConfig(lease_poll_s=60.0))
    with TestClient(create_app(s, api)) as http:
        submit(s, INK)
        assert len(http.post(f"/v1/workers/{holder}/lease", json={"max_tasks": 1}).json()["leases"]) == 1  # it holds INK
        got: list = []

        def poll() -> None:
            started = time.monotonic()
            leases = http.post(f"/v1/workers/{other}/lease", json={"max_tasks": 1, "wait_s": 30.0}).json()["leases"]
            got.extend((le["task_id"], time.monotonic() - started) for le in leases)

        polling = threading.Thread(target=poll)
        polling.start()
        task = {"input": {"prompt": "p", "loras": INK}}
        ink = (http.post("/v1/tasks", json=task).json()["id"] if call == "one" else
               http.post("/v1/tasks/batch", json={"tasks": [task]}).json()["tasks"][0]["id"])
        polling.join(timeout=40)
    s.close()
    # Without the wake-up, the poll's last look at the end of its 30 s wait would be the first to take it.
    ((task_id, waited_s),) = got
    assert task_id == ink and waited_s < 15.0
