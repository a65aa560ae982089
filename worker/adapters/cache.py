"""The node's disk cache of adapters, shared by its ranks (and by workers on the node that name the
same lora.cache_dir): files by content, `<sha256>.safetensors`, and for each source URL the content
it gave. A file is fetched once per node: a lock file per source lets one process download while
the others wait and then find it. The least recently used files go when the cache holds more than
lora.cache_mb; a file evicted under a rank that still needs it is fetched again by that rank.

Every file in it passed worker.adapters.files.inspect_file; a sha256 a task gives must match.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import secrets
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from worker.adapters import sources
from worker.adapters.files import inspect_file
from worker.adapters.sources import AdapterRefused, Source
from worker.config import LoraConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedAdapter:
    sha256: str
    path: Path
    bytes: int
    rank: int


class AdapterCache:
    def __init__(self, cfg: LoraConfig, fetch: Callable[[Source, Path, LoraConfig], None] = sources.fetch) -> None:
        self.cfg = cfg
        self.root = Path(cfg.cache_dir)
        self._fetch = fetch
        self.hits = 0
        self.misses = 0
        self._ranks: dict[str, int] = {}  # sha256 -> rank, each file's header read once by this process

    def open(self) -> None:
        """Makes the cache's folders; a config error names lora.cache_dir when it cannot."""
        try:
            for sub in ("", "sources", "locks"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"lora.cache_dir: cannot use {self.root}: {e.strerror or e}") from None

    def get(self, source: Source, sha256: str | None = None) -> CachedAdapter:
        """The adapter `source` names, from the cache or fetched into it; AdapterRefused naming the
        field when it is not acceptable, AdapterUnavailable when it cannot be fetched now."""
        if (found := self._cached(source, sha256)) is not None:
            self.hits += 1
            return found
        with self._locked(f"source-{_digest(source.url)}"):
            if (found := self._cached(source, sha256)) is not None:  # another rank fetched it meanwhile
                self.hits += 1
                return found
            self.misses += 1
            adapter = self._fetched(source, sha256)
        self._evict(keep=adapter.path)
        return adapter

    def has(self, source: Source, sha256: str | None = None) -> bool:
        """Whether `get` would find it here, without fetching (it may still be evicted meanwhile)."""
        sha256 = sha256 or self._known(source)
        return sha256 is not None and (self.root / f"{sha256}.safetensors").exists()

    def _known(self, source: Source) -> str | None:
        """The content `source` gave when it was last fetched; None: never fetched here."""
        try:
            return (self.root / "sources" / _digest(source.url)).read_text().strip()
        except OSError:
            return None

    def _cached(self, source: Source, sha256: str | None) -> CachedAdapter | None:
        if (sha256 := sha256 or self._known(source)) is None:
            return None
        path = self.root / f"{sha256}.safetensors"
        try:
            os.utime(path)  # recently used: the last to be evicted
            size = path.stat().st_size
        except OSError:
            return None
        if sha256 not in self._ranks:  # every rank asks for a round's files each round: read a header once
            self._ranks[sha256] = inspect_file(path, source.field, self.cfg.max_rank).rank
        return CachedAdapter(sha256, path, size, self._ranks[sha256])

    def _fetched(self, source: Source, expected: str | None) -> CachedAdapter:
        tmp = self.root / f".fetch-{secrets.token_hex(8)}"
        try:
            self._fetch(source, tmp, self.cfg)
            checked = inspect_file(tmp, source.field, self.cfg.max_rank)
            sha256 = _file_sha256(tmp)
            if expected is not None and sha256 != expected:
                raise AdapterRefused(f"{source.field}: the file's sha256 is {sha256}, not the {expected} given")
            path = self.root / f"{sha256}.safetensors"
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        (self.root / "sources" / _digest(source.url)).write_text(sha256)
        self._ranks[sha256] = checked.rank
        log.info("adapter %s fetched: %s, rank %d, %d bytes", source.url, sha256[:12], checked.rank,
                 path.stat().st_size)
        return CachedAdapter(sha256, path, path.stat().st_size, checked.rank)

    def _evict(self, keep: Path) -> None:
        """The least recently used files, until the cache holds at most lora.cache_mb (never `keep`)."""
        with self._locked("evict"):
            files = []
            for path in self.root.glob("*.safetensors"):
                try:
                    st = path.stat()
                except OSError:
                    continue
                files.append((st.st_mtime, st.st_size, path))
            total = sum(size for _, size, _ in files)
            for _, size, path in sorted(files, key=lambda f: f[0]):
                if total <= self.cfg.cache_mb << 20:
                    break
                if path != keep:
                    path.unlink(missing_ok=True)
                    total -= size
                    log.info("adapter cache: evicted %s (%d bytes)", path.name, size)

    @contextmanager
    def _locked(self, name: str):
        with open(self.root / "locks" / name, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
