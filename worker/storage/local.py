"""A directory on local disk (or a mounted volume): the embedded default."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from worker.storage.base import EXTENSIONS, Artifact, StoredObject


class LocalStore:
    """Objects named after the task id. Writes are atomic: temp file + rename."""

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
