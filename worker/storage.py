"""Where images go. Object names derive from the task id, so a retried task overwrites its own
object instead of leaving a second one.

The storage issue adds Google Cloud Storage behind the same `Store` interface.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from worker.config import StoreTarget

EXTENSIONS = {"image/png": "png"}


@dataclass(frozen=True)
class StoredObject:
    uri: str
    bytes: int
    sha256: str


class Store(Protocol):
    def check_writable(self) -> None:
        """Raises with a clear message if results cannot be stored; called before 'ready'."""

    def put(self, task_id: str, data: bytes, content_type: str) -> StoredObject: ...


class LocalStore:
    """A directory on local disk (or a mounted volume). Writes are atomic: temp file + rename."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def check_writable(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self.root, prefix=".probe-"):
            pass

    def object_path(self, task_id: str, content_type: str) -> Path:
        return self.root / f"{task_id}.{EXTENSIONS[content_type]}"

    def put(self, task_id: str, data: bytes, content_type: str) -> StoredObject:
        path = self.object_path(task_id, content_type)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{task_id}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)  # atomic: readers see the old object or the whole new one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return StoredObject(uri=path.as_uri(), bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def build_store(cfg: StoreTarget) -> Store:
    if cfg.kind == "local":
        return LocalStore(cfg.local.root)
    raise ValueError(f"storage.kind: unknown store {cfg.kind!r}")
