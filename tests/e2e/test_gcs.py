"""Results to GCS end to end: the real scheduler, a torchrun worker (one rank: storing is rank 0's),
and a real GCS emulator (fake-gcs-server on 127.0.0.1) read back with the official
google-cloud-storage client."""

from __future__ import annotations

import hashlib
import io

import pytest
import torch
from PIL import Image

from launch.local import wait_until
from tests.harness import Emulator, Stack, ready_worker

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

BUCKET = "results"


@pytest.fixture(scope="module")
def gcs_stack(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("gcs")
    emu = Emulator(tmp, persistent=True)
    emu.bucket(BUCKET)
    stack = Stack(tmp, tiny_model, max_attempts=5)
    stack.emulator = emu
    stack.proc = stack.worker(nproc=1, env={"STORAGE_EMULATOR_HOST": emu.url}, overrides=[
        "storage.kind=gcs", f"storage.gcs.bucket={BUCKET}", "storage.gcs.deadline_s=3.0",
        "storage.gcs.backoff_max_s=1.0", "storage.gcs.timeout_s=2.0", "storage.gcs.include_prompt=true"])
    yield stack
    stack.close()
    emu.stop()


def blob_of(stack, task: dict):
    uri = task["result"]["uri"]
    assert uri.startswith(f"gs://{BUCKET}/")
    return stack.emulator.bucket(BUCKET).get_blob(uri.removeprefix(f"gs://{BUCKET}/"))


def objects(stack) -> list[str]:
    return sorted(b.name for b in stack.emulator.client().list_blobs(BUCKET))


def test_results_are_stored_read_back_and_identical(gcs_stack, tiny_model, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_stack.emulator.url)
    inputs = [{"prompt": "a lighthouse", "width": 128, "height": 128, "seed": 1, "output_format": "png"},
              {"prompt": "a red fox", "width": 192, "height": 128, "seed": 2, "output_format": "webp"},
              {"prompt": "a whale", "width": 128, "height": 192, "seed": 3, "output_format": "jpeg"}]
    ids = [gcs_stack.client.submit(i)["id"] for i in inputs]
    done = gcs_stack.client.wait(ids, 120, proc=gcs_stack.proc)
    for task_id, inp, fmt, ctype in zip(ids, inputs, ("PNG", "WEBP", "JPEG"), ("image/png", "image/webp", "image/jpeg")):
        task = done[task_id]
        assert task["status"] == "succeeded", task["error"]
        blob = blob_of(gcs_stack, task)
        data = blob.download_as_bytes()
        assert hashlib.sha256(data).hexdigest() == task["result"]["sha256"] and len(data) == task["result"]["bytes"]
        assert blob.content_type == ctype == task["result"]["content_type"]
        meta = blob.metadata
        assert meta["task_id"] == task_id and meta["seed"] == str(inp["seed"]) and meta["model"] == "tiny-flux"
        assert (meta["width"], meta["height"]) == (str(inp["width"]), str(inp["height"]))
        assert meta["prompt_sha256"] == hashlib.sha256(inp["prompt"].encode()).hexdigest()
        assert meta["prompt"] == inp["prompt"]  # include_prompt = true
        with Image.open(io.BytesIO(data)) as img:
            assert img.format == fmt and img.size == (inp["width"], inp["height"])
    # Byte-identical to what this process generates and encodes for the same (prompt, seed, size).
    from launch.local import REPO
    from worker.config import ModelConfig, load_config
    from worker.storage.encode import encode_image
    from worker.model.engine import Engine
    from worker.model.job import Job

    engine = Engine.load(ModelConfig(source=str(tiny_model), dtype="float32", device="cpu",
                                     max_sequence_length=64), torch.device("cpu"),
                         load_config(REPO / "configs" / "tiny.toml").speed)  # the worker's switches
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like each worker rank: channels_last convolutions round by thread count
    try:
        pic = engine.generate(Job(task_id="x", prompt="a lighthouse", width=128, height=128, steps=4, seed=1,
                                  output_format="png"))
    finally:
        torch.set_num_threads(threads)
    assert encode_image(pic.pixels, "png")[0] == blob_of(gcs_stack, done[ids[0]]).download_as_bytes()


def test_storage_down_mid_run_nothing_lost_nothing_unbacked(gcs_stack, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_stack.emulator.url)
    ids = [gcs_stack.client.submit({"prompt": f"outage {i}", "width": 128, "height": 128})["id"] for i in range(8)]
    gcs_stack.client.wait(ids[:1], 60, proc=gcs_stack.proc)
    gcs_stack.emulator.stop()

    def failed_storage() -> bool:  # the outage outlived the worker's storage deadline for some task
        return any((gcs_stack.client.task(t)["error"] or {}).get("code") == "storage_unavailable" for t in ids)

    wait_until(failed_storage, 60, "a task to fail storage_unavailable", gcs_stack.proc, every_s=0.5)
    gcs_stack.emulator.start()
    done = gcs_stack.client.wait(ids, 180, proc=gcs_stack.proc)
    codes = set()
    for task_id in ids:
        task = done[task_id]
        if task["status"] == "succeeded":
            blob = blob_of(gcs_stack, task)  # never a success without its object
            assert blob is not None and hashlib.sha256(blob.download_as_bytes()).hexdigest() == task["result"]["sha256"]
        else:
            assert task["error"]["code"] == "storage_unavailable" and task["error"]["retryable"]
        if task["attempts"] > 1:
            codes.add("retried")
    assert "retried" in codes  # the outage was seen, and tasks were retried through it
    assert sum(done[t]["status"] == "succeeded" for t in ids) >= 1
    # One object per succeeded task, none for the others.
    succeeded = {done[t]["result"]["uri"].removeprefix(f"gs://{BUCKET}/") for t in ids if done[t]["status"] == "succeeded"}
    assert succeeded <= set(objects(gcs_stack))
    assert not any(t in name for name in objects(gcs_stack) for t in ids if done[t]["status"] != "succeeded")


def test_a_missing_bucket_stops_start_up_naming_it(make_stack, tmp_path):
    emu = Emulator(tmp_path)
    try:
        stack = make_stack()
        proc = stack.worker(nproc=1, env={"STORAGE_EMULATOR_HOST": emu.url}, overrides=[
            "storage.kind=gcs", "storage.gcs.bucket=no-such-bucket", "storage.gcs.deadline_s=2.0"])
        assert proc.wait(120) != 0
        assert "not starting: storage.gcs.bucket: bucket 'no-such-bucket' does not exist" in proc.output()
        assert stack.registered() == []
    finally:
        emu.stop()


def test_a_retry_in_another_batch_size_after_a_kill_between_store_and_report_takes_the_first_object(
        make_stack, tmp_path, monkeypatch):
    emu = Emulator(tmp_path)
    bucket = emu.bucket("retried")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.url)
    gcs = ["storage.kind=gcs", "storage.gcs.bucket=retried", "storage.gcs.deadline_s=5.0"]
    stack = make_stack(lease_ttl=3.0)
    try:
        first = stack.worker(nproc=1, env={"STORAGE_EMULATOR_HOST": emu.url}, overrides=gcs)
        ready_worker(stack, first)
        # 1024x1024 takes seconds on the tiny model: time to take the scheduler away mid-task.
        task = stack.client.submit({"prompt": "stored, never reported", "width": 1024, "height": 1024})["id"]
        wait_until(lambda: stack.client.task(task)["status"] == "processing", 60, "processing", first)
        stack.scheduler.kill()  # the report cannot go through...
        stored = wait_until(lambda: next((b for b in emu.client().list_blobs("retried") if task in b.name), None),
                            60, "the first attempt's object", first)
        first.kill()  # ...and the worker dies between store and report
        stack.scheduler = stack.start_scheduler()
        wait_until(lambda: stack.client.task(task)["status"] == "queued", 30, "the lease to expire")
        # The retry runs batched with another task of its size: other kernels, other bytes.
        other = stack.client.submit({"prompt": "its batch mate", "width": 1024, "height": 1024})["id"]
        second = stack.worker(nproc=1, env={"STORAGE_EMULATOR_HOST": emu.url},
                              overrides=[*gcs, "batch.max_size=2", "batch.window_s=2.0"])
        done = stack.client.wait([task, other], 180, proc=second)
        result = done[task]
        assert result["status"] == "succeeded", result["error"]
        assert result["attempts"] == 2 and result["result"]["batch_size"] == 2
        blob = bucket.get_blob(stored.name)
        assert (blob.md5_hash, blob.generation) == (stored.md5_hash, stored.generation)  # the first object
        assert result["result"]["sha256"] == stored.metadata["sha256"] == hashlib.sha256(
            blob.download_as_bytes()).hexdigest()
        assert result["result"]["uri"] == f"gs://retried/{stored.name}"
        assert [b.name for b in emu.client().list_blobs("retried") if task in b.name] == [stored.name]
        assert "an earlier attempt stored" in second.output()
    finally:
        emu.stop()
