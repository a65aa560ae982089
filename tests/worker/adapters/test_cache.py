"""The node's adapter cache: by content and by source, each file fetched once however many ranks ask
at once, a sha256 given checked, the least recently used evicted under the byte budget. The
downloads are a fake here (test_sources.py has the real ones)."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.worker.adapters.conftest import lora_file
from worker.adapters import AdapterCache, AdapterRefused, Source
from worker.config import LoraConfig


class Origin:
    """Serves files from a folder by the URL's last segment, counting downloads; may hold each one
    until released (ranks asking at once)."""

    def __init__(self, root: Path) -> None:
        self.root, self.fetched, self.gate = root, [], threading.Event()
        self.gate.set()

    def __call__(self, source: Source, dest: Path, cfg: LoraConfig) -> None:
        self.fetched.append(source.url)
        assert self.gate.wait(10)
        shutil.copyfile(self.root / source.url.rsplit("/", 1)[-1], dest)


@pytest.fixture
def origin(tmp_path) -> Origin:
    root = tmp_path / "origin"
    root.mkdir()
    for i, name in enumerate(("a", "b", "c")):
        lora_file(root / f"{name}.safetensors", rank=4, layers=200, fill=0.01 * (i + 1))  # ~0.24 MiB each
    return Origin(root)


def cache(tmp_path, origin, **kw) -> AdapterCache:
    c = AdapterCache(LoraConfig(cache_dir=str(tmp_path / "cache"), **kw), fetch=origin)
    c.open()
    return c


def src(name: str) -> Source:
    return Source(f"https://hub.example/loras/{name}.safetensors", "input.loras[0].source")


def sha(origin: Origin, name: str) -> str:
    return hashlib.sha256((origin.root / f"{name}.safetensors").read_bytes()).hexdigest()


def test_a_source_is_fetched_once_then_found_by_source_and_by_content(tmp_path, origin):
    c = cache(tmp_path, origin)
    first = c.get(src("a"))
    assert first.sha256 == sha(origin, "a") and first.rank == 4 and first.path.name == f"{first.sha256}.safetensors"
    assert c.get(src("a")) == first
    # Another URL for the same bytes, with its sha256: found by content, not fetched.
    assert c.get(Source("https://mirror.example/a.safetensors", "f"), sha256=first.sha256) == first
    assert origin.fetched == [src("a").url] and (c.hits, c.misses) == (2, 1)


def test_a_wrong_sha256_is_refused_and_nothing_is_kept(tmp_path, origin):
    c = cache(tmp_path, origin)
    with pytest.raises(AdapterRefused, match=r"input.loras\[0\].source: the file's sha256 is [0-9a-f]{64}, not the 0+ given"):
        c.get(src("a"), sha256="0" * 64)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_file()) == []
    assert c.get(src("a"), sha256=sha(origin, "a")).sha256 == sha(origin, "a")


def test_ranks_asking_at_once_fetch_it_once(tmp_path, origin):
    c = cache(tmp_path, origin)
    origin.gate.clear()
    got = []
    ranks = [threading.Thread(target=lambda: got.append(c.get(src("b")))) for _ in range(4)]
    for rank in ranks:
        rank.start()
    deadline = time.monotonic() + 10
    while not origin.fetched and time.monotonic() < deadline:  # the first is downloading
        time.sleep(0.01)
    origin.gate.set()
    for rank in ranks:
        rank.join(10)
    assert origin.fetched == [src("b").url] and len(got) == 4 and len({g.sha256 for g in got}) == 1


def test_the_least_recently_used_go_first_when_the_cache_is_over_its_budget(tmp_path, origin):
    size = (origin.root / "a.safetensors").stat().st_size
    c = cache(tmp_path, origin, cache_mb=1)
    assert 3 * size < 1 << 20 < 6 * size  # three fit in the budget, six do not
    for i, name in enumerate(("a", "b", "c")):
        c.get(src(name))
        os.utime(c.root / f"{sha(origin, name)}.safetensors", (1000 + i, 1000 + i))
    c.get(src("a"))  # used again: now the most recent
    for extra in range(3):  # three more files push the oldest out
        lora_file(origin.root / f"x{extra}.safetensors", rank=4, layers=200, fill=0.5 + extra)
        c.get(src(f"x{extra}"))
    kept = {p.name for p in c.root.glob("*.safetensors")}
    assert f"{sha(origin, 'a')}.safetensors" in kept
    assert f"{sha(origin, 'b')}.safetensors" not in kept
    assert sum((c.root / n).stat().st_size for n in kept) <= 1 << 20
    c.get(src("b"))  # evicted: fetched again
    assert origin.fetched.count(src("b").url) == 2
