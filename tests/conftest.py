"""Shared fixtures: the tiny models (built once per run) and a stack of real local processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.local import REPO, Client, Proc, free_port, start_scheduler, start_worker

TINY_CONFIG = REPO / "configs" / "tiny.toml"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from worker.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-flux")


@pytest.fixture(scope="session")
def detoxify_dir(tmp_path_factory) -> Path:
    """A tiny random-weight detoxify checkpoint with its HF config and tokenizer, built offline."""
    from safety.random_models import make_detoxify_checkpoint

    out = tmp_path_factory.mktemp("detoxify")
    make_detoxify_checkpoint(out)
    return out


@pytest.fixture(scope="session")
def vit_dir(tmp_path_factory) -> Path:
    """A tiny random-weight ViT image classifier (labels normal, nsfw) saved with save_pretrained."""
    from safety.random_models import make_vit_classifier

    return make_vit_classifier(tmp_path_factory.mktemp("vit") / "nsfw-vit")


class Stack:
    """A real scheduler on 127.0.0.1 and the torchrun workers started against it."""

    def __init__(self, tmp: Path, model: Path, lease_ttl: float = 15.0, max_attempts: int = 3) -> None:
        self.tmp, self.model = tmp, model
        self.lease_ttl, self.max_attempts = lease_ttl, max_attempts
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.images = tmp / "images"
        self.workers: list[Proc] = []
        self.scheduler = self.start_scheduler()
        self.client = Client(self.url)

    def start_scheduler(self) -> Proc:
        return start_scheduler(self.tmp / "scheduler.db", self.port, self.tmp / "scheduler.log",
                               lease_ttl=self.lease_ttl, max_attempts=self.max_attempts)

    def worker(self, nproc: int = 2, overrides: list[str] = (), max_restarts: int = 0,
               env: dict[str, str] | None = None) -> Proc:
        ov = [f"queue.url={self.url}", f"storage.local.root={self.images}", f"model.source={self.model}",
              "queue.heartbeat_interval_s=1.0", "safety.text.backend=profanity", *overrides]
        proc = start_worker(TINY_CONFIG, nproc, self.tmp / f"worker{len(self.workers)}.log", ov,
                            max_restarts=max_restarts, env=env)
        self.workers.append(proc)
        return proc

    def registered(self) -> list[dict]:
        return self.client.http.get("/v1/workers").json()

    def objects(self) -> list[Path]:
        """Stored objects, without in-progress temp files (dot files)."""
        return sorted(p for p in self.images.glob("*") if not p.name.startswith("."))

    def close(self) -> None:
        for w in self.workers:
            if w.alive():
                w.kill()
        if self.scheduler.alive():
            self.scheduler.stop()


@pytest.fixture
def stack(tmp_path, tiny_model):
    s = Stack(tmp_path, tiny_model)
    yield s
    s.close()


@pytest.fixture
def make_stack(tmp_path, tiny_model):
    made: list[Stack] = []

    def make(**kw) -> Stack:
        made.append(Stack(tmp_path / f"stack{len(made)}", tiny_model, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()
