"""Where images go: a local directory (the embedded default) or Google Cloud Storage (worker.gcs).

Object names derive from the task id (and its submission date), so a retried task writes its own
object again instead of leaving a second one.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from worker.config import StoreTarget

EXTENSIONS = {"image/png": "png", "image/webp": "webp", "image/jpeg": "jpg"}


@dataclass(frozen=True)
class Artifact:
    """One encoded result and what describes it."""

    task_id: str
    data: bytes
    content_type: str
    created_at: float  # the task's submission time (epoch s): the same on every attempt
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def ext(self) -> str:
        return EXTENSIONS[self.content_type]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class StoredObject:
    uri: str
    bytes: int
    sha256: str
    url: str | None = None  # a signed URL, where the store makes them


class StorageUnavailable(RuntimeError):
    """The store did not answer within its retry deadline; the task should be retried later."""


class StorageConfigError(RuntimeError):
    """The configured location is missing or not writable: the worker must not become ready."""


class ObjectConflict(RuntimeError):
    """The object's name is taken by other bytes: never overwritten, never reported as success."""


class Store(Protocol):
    def check_writable(self) -> None:
        """Raises with a clear message if results cannot be stored; called before 'ready'."""

    def put(self, item: Artifact) -> StoredObject: ...


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

    def put(self, item: Artifact) -> StoredObject:
        path = self.object_path(item.task_id, item.content_type)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{item.task_id}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(item.data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)  # atomic: readers see the old object or the whole new one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return StoredObject(uri=path.as_uri(), bytes=len(item.data), sha256=item.sha256)


def build_store(cfg: StoreTarget) -> Store:
    if cfg.kind == "local":
        return LocalStore(cfg.local.root)
    if cfg.kind == "gcs":
        from worker.gcs import GCSStore  # google-cloud-storage only where configured

        return GCSStore(cfg.gcs)
    raise ValueError(f"storage.kind: unknown store {cfg.kind!r}")
