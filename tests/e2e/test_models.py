"""End to end, several models on one fleet: the real scheduler routing two models of different
DiT families (tiny random FLUX and PixArt-Sigma) to two torchrun workers. Every task is made by a
worker holding its model (its result says which), a worker swaps in lockstep on both its ranks
under load, a model that fails to load fails only its own tasks, and an unknown model is refused
at submission."""

from __future__ import annotations

import httpx
import pytest

from launch.local import wait_until
from tests.harness import Stack, ready_worker

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

MODELS = ["tiny-flux", "tiny-pixart", "broken"]
SMALL = {"width": 64, "height": 64, "steps": 2}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_model, tiny_pixart):
    tmp = tmp_path_factory.mktemp("models")
    stack = Stack(tmp, tiny_model, scheduler_args=[
        "--set", f"models.ids={MODELS}".replace("'", '"'), "--set", "models.cold_wait_s=2"])
    # Worker A, 2 ranks: FLUX at start; it can load PixArt, and a model whose folder does not exist.
    stack.a = stack.worker(nproc=2, overrides=[f"models.tiny-pixart.source={tiny_pixart}",
                                                f"models.broken.source={tmp / 'no-such-model'}"])
    yield stack
    stack.close()


def submit(stack: Stack, model: str, n: int, **kw) -> list[str]:
    return [stack.client.submit({"prompt": f"{model} {i}", "seed": i, **SMALL}, model=model, **kw)["id"]
            for i in range(n)]


def swaps(stack: Stack) -> dict[str, int]:
    return {w["id"]: w["counters"].get("swaps", 0) for w in stack.registered() if w["status"] == "ready"}


def made_by_their_model(tasks: dict[str, dict]) -> bool:
    return all(t["status"] == "succeeded" and t["result"]["model"] == t["model"] for t in tasks.values())


def test_one_worker_serves_both_families_swapping_on_all_its_ranks(fleet):
    a = ready_worker(fleet, fleet.a)
    assert a["models"] == {"resident": ["tiny-flux"], "loadable": ["broken", "tiny-pixart"]}
    ids = submit(fleet, "tiny-flux", 2) + submit(fleet, "tiny-pixart", 2)  # nobody holds PixArt: A loads it
    done = fleet.client.wait(ids, 180, proc=fleet.a)
    assert made_by_their_model(done)
    # Counted in the next heartbeat (every second here).
    wait_until(lambda: swaps(fleet).get(a["id"], 0) >= 1, 10, "the swap in A's heartbeat counters", fleet.a)
    pixart = [t for t in done.values() if t["model"] == "tiny-pixart"]
    assert all(t["result"]["timings_ms"].get("swap", 0) > 0 for t in pixart[:1])  # the first waited for the swap


def test_a_model_that_fails_to_load_fails_only_its_tasks_and_the_worker_serves_on(fleet):
    [bad] = submit(fleet, "broken", 1, max_attempts=1)
    failed = fleet.client.wait([bad], 180, proc=fleet.a)[bad]
    assert failed["status"] == "failed" and failed["error"]["code"] == "model_unavailable"
    assert "loading model 'broken' failed on this worker" in failed["error"]["message"]
    ids = submit(fleet, "tiny-flux", 1) + submit(fleet, "tiny-pixart", 1)
    assert made_by_their_model(fleet.client.wait(ids, 180, proc=fleet.a))
    [a] = [w for w in fleet.registered() if w["status"] == "ready"]
    assert "broken" not in a["models"]["loadable"] + a["models"]["resident"]


def test_two_workers_serve_two_models_from_one_queue(fleet, tiny_pixart):
    known = len(fleet.registered())
    fleet.b = fleet.worker(nproc=1, overrides=["model.name=tiny-pixart", f"model.source={tiny_pixart}"])
    b = ready_worker(fleet, fleet.b, known)
    assert b["models"] == {"resident": ["tiny-pixart"], "loadable": []}
    before = sum(swaps(fleet).values())
    ids = [i for n in range(3) for i in submit(fleet, "tiny-flux", 2) + submit(fleet, "tiny-pixart", 2)]
    done = fleet.client.wait(ids, 240, proc=fleet.b)
    assert made_by_their_model(done)
    by_worker = {t["worker_id"] for t in done.values() if t["model"] == "tiny-flux"}
    assert b["id"] not in by_worker  # B cannot load FLUX
    print(f"swaps during mixed traffic on two workers: {sum(swaps(fleet).values()) - before}")


def test_an_unknown_model_is_refused_at_submission(fleet):
    with pytest.raises(httpx.HTTPStatusError) as refused:
        fleet.client.submit({"prompt": "p"}, model="sana")
    assert refused.value.response.status_code == 422
    assert "'sana' is not one of this fleet's models" in refused.value.response.json()["detail"]
