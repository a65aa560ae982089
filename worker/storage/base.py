"""What every store shares: the encoded result to store (Artifact), what it became (StoredObject),
the errors a store raises, and the ImageStore interface.

Object names derive from the task id and the image's index (and the submission date), and a store creates an object once,
never overwriting it: an attempt that finds its task's object already stored takes that object as
its result (it passed the checks when it was stored), so a retry can neither leave a second object
nor fail for good because its bytes differ.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Protocol

EXTENSIONS = {"image/png": "png", "image/webp": "webp", "image/jpeg": "jpg"}


@dataclass(frozen=True)
class Artifact:
    """One encoded result and what describes it."""

    task_id: str
    data: bytes
    content_type: str
    created_at: float  # the task's submission time (epoch s): the same on every attempt
    metadata: dict[str, str] = field(default_factory=dict)
    index: int = 0  # which of the task's images (input.num_images)

    @property
    def stem(self) -> str:
        """Its name before the extension: the task id for the first image, `<task id>~<index>` for
        the others. "~" is no task id's (worker.serving.validation), so no task's name is another's."""
        return self.task_id if self.index == 0 else f"{self.task_id}~{self.index}"

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
    """The object's name is taken by an object of another task: never overwritten, never reported as
    success."""


class UploadCorrupted(RuntimeError):
    """The store holds other bytes than were sent; the object was removed, a retry may succeed."""


class ImageStore(Protocol):
    def check_writable(self) -> None:
        """Raises with a clear message if results cannot be stored; called before 'ready'."""

    def put(self, item: Artifact) -> StoredObject:
        """Creates the task's object, or returns the one an earlier attempt of the task stored."""

    def remove(self, uri: str) -> None:
        """Deletes an object this store made (a cancelled task's); gone already is fine."""
