"""Where images go: a local directory (local) or Google Cloud Storage (gcs), behind one interface
(base). `build_store` picks one from the config.
"""

from __future__ import annotations

from worker.config import StoreTarget
from worker.storage.base import (
    Artifact,
    ImageStore,
    ObjectConflict,
    StorageConfigError,
    StorageUnavailable,
    StoredObject,
    UploadCorrupted,
)
from worker.storage.local import LocalStore

__all__ = ["Artifact", "ImageStore", "LocalStore", "ObjectConflict", "StorageConfigError", "StorageUnavailable",
           "StoredObject", "UploadCorrupted", "build_store"]


def build_store(cfg: StoreTarget) -> ImageStore:
    if cfg.kind == "local":
        return LocalStore(cfg.local.root)
    if cfg.kind == "gcs":
        from worker.storage.gcs import GCSStore  # google-cloud-storage only where configured

        return GCSStore(cfg.gcs)
    raise ValueError(f"storage.kind: unknown store {cfg.kind!r}")
