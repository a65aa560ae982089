"""The sets of adapters a worker says it holds: each set a round ran, while all its adapters stay
loaded, most recent first; nothing said until it has held adapters; and said in its calls only
then (a worker without adapters sends the body schedulers before the field accept)."""

from __future__ import annotations

from types import SimpleNamespace

from protocol import Exchange, LeaseRequest, adapter_set_key
from worker.model.job import Job, LoraRef
from worker.serving.adapter_sets import HeldSets
from worker.serving.state import WorkerState

INK = [{"source": "https://hub.example/loras/ink.safetensors"}]
INK_FOG = INK + [{"source": "fog", "scale": 0.5}]


def test_a_set_is_held_while_every_adapter_of_it_is_loaded():
    sets = HeldSets(most=2)
    sets.used("a" * 16, ["lora-1", "lora-2"])
    sets.used("b" * 16, ["lora-2"])
    assert sets.held(["lora-1", "lora-2"]) == ["b" * 16, "a" * 16]
    assert sets.held(["lora-2"]) == ["b" * 16]  # lora-1 was evicted: a is forgotten
    sets.used("c" * 16, ["lora-3"])
    sets.used("d" * 16, ["lora-3"])
    assert sets.held(["lora-2", "lora-3"]) == ["d" * 16, "c" * 16]  # at most two remembered
    sets.used("", [])
    assert sets.held(["lora-3"]) == ["d" * 16, "c" * 16]


def round_of(loras) -> list:
    refs = tuple(LoraRef(source=item["source"], scale=item.get("scale", 1.0), sha256=f"{i:064x}")
                 for i, item in enumerate(loras or []))
    job = Job(task_id="t", prompt="p", width=64, height=64, steps=1, seed=1, output_format="png", loras=refs)
    return [SimpleNamespace(job=job, lease=SimpleNamespace(input={"prompt": "p"} | ({"loras": loras} if loras else {})))]


def test_after_a_round_the_state_says_the_sets_held_and_nothing_before_any():
    state, sets = WorkerState(), HeldSets()
    engine = SimpleNamespace(adapters=SimpleNamespace(held=lambda: [f"lora-{0:016x}", f"lora-{1:016x}"]))
    sets.after(round_of(None), engine, state)
    assert state.adapters is None  # never held any: its calls say nothing
    sets.after(round_of(INK_FOG), engine, state)
    sets.after(round_of(INK), engine, state)
    assert state.adapters == [adapter_set_key(INK), adapter_set_key(INK_FOG)]
    sets.after(round_of(None), SimpleNamespace(adapters=SimpleNamespace(held=lambda: [])), state)
    assert state.adapters == []  # said: it holds none now


def test_calls_say_the_sets_only_once_there_are_any():
    assert "adapters" not in LeaseRequest().model_dump_json()
    assert "adapters" not in Exchange(exchange_id="x").model_dump_json()
    assert '"adapters":[]' in LeaseRequest(adapters=[]).model_dump_json()
    assert LeaseRequest.model_validate_json(LeaseRequest(adapters=["0123456789abcdef"]).model_dump_json()).adapters == [
        "0123456789abcdef"]
