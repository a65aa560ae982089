"""A directory on local disk (or a mounted volume): the embedded default."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from worker.storage.base import EXTENSIONS, Artifact, StorageConfigError, StoredObject

log = logging.getLogger(__name__)


class LocalStore:
    """Objects named after the task id, created once: the bytes go to a temp file that is then
    hard-linked to the object's name, which fails if the name exists (atomic on POSIX). An existing
    object is an earlier attempt's result and is returned as such."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def check_writable(self) -> None:
        """A location that cannot be made or written is a config error, never a crash: no restart
        would cure it."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=".probe-"):
                pass
        except OSError as e:
            raise StorageConfigError(f"local.root: cannot write to {self.root}: {e.strerror or e}") from None

    def object_path(self, stem: str, content_type: str) -> Path:
        return self.root / f"{stem}.{EXTENSIONS[content_type]}"

    def put(self, item: Artifact) -> StoredObject:
        path = self.object_path(item.stem, item.content_type)
        tmp = self.root / f".{item.stem}.{secrets.token_hex(8)}"
        # Not mkstemp: its 0600 would stay with the linked object. 0666 less the umask (typically
        # 0644) makes results as readable as any file the operator's processes write.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(item.data)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)  # readers see no object or the whole one; never replaced
        except FileExistsError:
            return self._earlier_attempt(path, item)
        finally:
            tmp.unlink(missing_ok=True)
        return StoredObject(uri=path.as_uri(), bytes=len(item.data), sha256=item.sha256)

    def remove(self, uri: str) -> None:
        path = Path(unquote(urlparse(uri).path)).resolve()
        if path.parent != self.root:  # only an object this store names, never another path
            raise ValueError(f"{uri} is not an object of {self.root}")
        path.unlink(missing_ok=True)

    @staticmethod
    def _earlier_attempt(path: Path, item: Artifact) -> StoredObject:
        data = path.read_bytes()
        log.info("task %s: an earlier attempt stored %s; it is the result", item.task_id, path)
        return StoredObject(uri=path.as_uri(), bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
