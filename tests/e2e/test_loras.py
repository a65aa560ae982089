"""End to end, LoRA adapters and several images per task (input.loras, input.num_images): the
scheduler, a 2-rank worker on the tiny model, tiny adapters built with peft at test time (non-zero
weights), served from a real HTTP server on 127.0.0.1 (an allowed prefix) and from the GCS emulator
(a registered name). Tasks with different adapter sets and several images succeed; image i of a task
is the one one unbatched rank makes with those adapters for seed + i (within one level per pixel:
the worker batches), stored as <task id>~i, and differs from the adapter-free one; a wrong sha256
and a pickle are refused naming the field; the scheduler refuses more adapters or images than its
live workers take. One worker stack for both features: each costs CI a dozen seconds."""

from __future__ import annotations

import hashlib
import io
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
import torch
from PIL import Image

from launch.local import REPO, wait_until
from protocol import adapter_set_key
from launch.tiny_model import make_tiny_lora
from tests.harness import Emulator
from worker.config import ModelConfig, load_config
from worker.model.adapters import Wanted
from worker.model.engine import Engine
from worker.model.job import Job

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

BASE = {"width": 128, "height": 128, "output_format": "png"}


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def served(tmp_path, tiny_model, monkeypatch):
    """Two adapters over HTTP, a third in the GCS emulator, and a pickle; their sha256s."""
    root = tmp_path / "served" / "loras"
    root.mkdir(parents=True)
    made = {name: make_tiny_lora(tiny_model, root / f"{name}.safetensors", rank=4, seed=seed)
            for seed, name in enumerate(("ink", "neon", "clay"))}
    torch.save({"lora_A.weight": torch.ones(4, 4)}, root / "evil.safetensors")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(root.parent)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    emu = Emulator(tmp_path / "gcs")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.url)
    emu.bucket("adapters").blob("flux/clay.safetensors").upload_from_filename(str(made["clay"]))
    yield {"url": f"http://127.0.0.1:{httpd.server_port}/loras", "emulator": emu.url,
           "sha": {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in made.items()}, "files": made}
    httpd.shutdown()
    emu.stop()


def pixels(uri: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(Path(urlparse(uri).path).read_bytes())).convert("RGB")).astype(int)


def test_tasks_bring_adapters_and_several_images_and_get_what_one_rank_makes_with_them(make_stack, served, tiny_model,
                                                                             tmp_path):
    stack = make_stack()
    stack.proc = stack.worker(nproc=2, overrides=[
        "parallel.mode=data", "batch.max_size=2", f"lora.cache_dir={tmp_path / 'cache'}", "speed.fuse_qkv=false",
        f'lora.allow=["{served["url"]}/"]', 'lora.registered={clay = "gs://adapters/flux/clay.safetensors"}'],
        env={"STORAGE_EMULATOR_HOST": served["emulator"]})
    url, sha = served["url"], served["sha"]
    inps = {
        "plain": {"prompt": "a lighthouse", "seed": 11, "num_images": 3, **BASE},
        "ink": {"prompt": "a lighthouse", "seed": 11, "loras": [{"source": f"{url}/ink.safetensors"}], **BASE},
        "ink+clay": {"prompt": "a lighthouse", "seed": 11, "num_images": 2, **BASE,
                     "loras": [{"source": f"{url}/ink.safetensors", "scale": 0.8, "sha256": sha["ink"]},
                               {"source": "clay", "scale": 0.5}]},
        "neon": {"prompt": "a tram", "seed": 3, "loras": [{"source": f"{url}/neon.safetensors", "scale": 1.5}], **BASE},
        "wrong hash": {"prompt": "a tram", **BASE, "loras": [{"source": f"{url}/neon.safetensors", "sha256": "0" * 64}]},
        "pickle": {"prompt": "a tram", **BASE, "loras": [{"source": f"{url}/evil.safetensors"}]},
        "not allowed": {"prompt": "a tram", **BASE, "loras": [{"source": "https://elsewhere.example/x.safetensors"}]},
    }
    ids = {name: stack.client.submit(inp)["id"] for name, inp in inps.items()}
    done = stack.client.wait(list(ids.values()), 240, proc=stack.proc)
    tasks = {name: done[task_id] for name, task_id in ids.items()}
    for name in ("plain", "ink", "ink+clay", "neon"):
        assert tasks[name]["status"] == "succeeded", (name, tasks[name]["error"])
    for name, why in [("wrong hash", "input.loras[0].source: the file's sha256 is"),
                      ("pickle", "input.loras[0].source: not a safetensors file"),
                      ("not allowed", "loras[0].source: https://elsewhere.example/x.safetensors is not under an allowed")]:
        error = tasks[name]["error"]
        assert tasks[name]["status"] == "failed" and error["code"] == "invalid_request" and not error["retryable"]
        assert why in error["message"], (name, error["message"])
    for name in ("plain", "ink+clay"):  # every image listed, named after the task, its top level the first
        task_id, result, n = ids[name], tasks[name]["result"], inps[name]["num_images"]
        assert [(i["index"], i["seed"], i["withheld"]) for i in result["images"]] == [
            (k, inps[name]["seed"] + k, None) for k in range(n)]
        assert [Path(urlparse(i["uri"]).path).name for i in result["images"]] == (
            [f"{task_id}.png"] + [f"{task_id}~{k}.png" for k in range(1, n)])
        assert (result["uri"], result["seed"]) == (result["images"][0]["uri"], inps[name]["seed"])
    # The result records each adapter's file, given or not.
    assert tasks["ink+clay"]["result"]["loras"] == [
        {"source": f"{url}/ink.safetensors", "scale": 0.8, "sha256": sha["ink"]},
        {"source": "gs://adapters/flux/clay.safetensors", "scale": 0.5, "sha256": sha["clay"]}]

    # The worker says which sets of adapters it holds loaded (the scheduler routes their tasks to it):
    # those of the tasks that ran, not those of the tasks refused, which the claims first marked.
    held = {adapter_set_key(inps[name]["loras"]) for name in ("ink", "ink+clay", "neon")}
    wait_until(lambda: [set(w["adapters"]) for w in stack.registered()] == [held], 60,
               "the worker saying the sets of adapters it holds", stack.proc)

    # What one unbatched rank in this process makes with the same adapters.
    engine = Engine.load(ModelConfig(source=str(tiny_model), dtype="float32", device="cpu", max_sequence_length=64),
                         torch.device("cpu"), load_config(REPO / "configs" / "tiny.toml", ["speed.fuse_qkv=false"]).speed)
    files = served["files"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker rank
    try:
        def alone(inp: dict, seed: int, adapters: list[tuple[str, float]]) -> np.ndarray:
            engine.adapters.use([Wanted(sha[n], files[n], s) for n, s in adapters])
            job = Job(task_id="ref", prompt=inp["prompt"], width=128, height=128, steps=4, seed=seed,
                      output_format="png")
            return engine.generate(job).pixels.astype(int)

        plain = alone(inps["plain"], 11, [])
        cases = [("plain", 11 + i, []) for i in range(3)] + [("ink", 11, [("ink", 1.0)]), ("neon", 3, [("neon", 1.5)])]
        cases += [("ink+clay", 11 + i, [("ink", 0.8), ("clay", 0.5)]) for i in range(2)]
        seen = {}
        for name, seed, adapters in cases:
            result = tasks[name]["result"]
            image = next(i for i in result["images"] if i["seed"] == seed)
            got = pixels(image["uri"])
            assert np.abs(got - alone(inps[name], seed, adapters)).max() <= 1, (name, seed)
            seen[(name, seed)] = got
    finally:
        torch.set_num_threads(threads)
    # More than the one level batching may move a pixel: the adapter changed the image.
    assert np.abs(seen[("ink", 11)] - plain).max() > 2
    assert np.abs(seen[("ink+clay", 11)] - seen[("ink", 11)]).max() > 2  # so did the second and the scale
    # And the adapter-free task got the adapter-free image, within the level its batch of two may move
    # a pixel, as every image above (exactly equal with earlier releases of the libraries; with
    # diffusers 0.42.1, peft 0.21.2 and transformers 5.24.0, one pixel one level apart).
    assert np.abs(seen[("plain", 11)] - plain).max() <= 1
    assert all(np.abs(seen[("plain", 11 + i)] - seen[("plain", 12 + i)]).max() > 8 for i in range(2))  # own seeds

    refused = stack.client.http.post("/v1/tasks", json={"input": {"prompt": "x", "loras": [{"source": "clay"}] * 4}})
    assert refused.status_code == 422
    assert refused.json()["detail"] == "input.loras: 4 adapter(s) is above every live worker's limit (3)"
    refused = stack.client.http.post("/v1/tasks", json={"input": {"prompt": "five cats", "num_images": 5}})
    assert refused.status_code == 422
    assert refused.json()["detail"] == "input.num_images: 5 is above every live worker's limit (4)"
