"""Results in Google Cloud Storage, written once per task and verified.

- Once per task: every upload has `if_generation_match=0` (create, never overwrite). A 412 means an
  earlier attempt of this task stored its object, which passed the checks when it was stored: that
  object is the result, whatever bytes this attempt made (kernels differ with batch size, rank count
  and thread count, so attempts need not be byte-identical). An object of another task under the
  name is a conflict, never overwritten.
- Verified: the upload carries its MD5, so GCS refuses a corrupt upload itself; success also needs
  the MD5 that GCS reports to match the bytes sent. A stored object that does not match is deleted
  and the task fails retryable.
- Retried with exponential backoff and full jitter on timeouts, connection errors, 429 and 5xx,
  within `deadline_s`; after that StorageUnavailable (the task fails retryable).
- Credentials: a service-account key file, else Application Default Credentials. With
  STORAGE_EMULATOR_HOST set the client talks to the emulator without auth.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import logging
import os
import uuid

import requests
from google.api_core import exceptions as gx
from google.auth import exceptions as auth_exceptions
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

from worker.config import GCSConfig
from worker.storage.base import (
    Artifact,
    ObjectConflict,
    StorageConfigError,
    StorageUnavailable,
    StoredObject,
    UploadCorrupted,
)

log = logging.getLogger(__name__)


def _transient(e: BaseException) -> bool:
    if isinstance(e, (gx.TooManyRequests, gx.ServerError)):  # 429, 5xx
        return True
    if isinstance(e, gx.GoogleAPICallError) and e.code == 408:  # request timeout: no class of its own
        return True
    return isinstance(e, (requests.ConnectionError, requests.Timeout, auth_exceptions.TransportError,
                          ConnectionError, TimeoutError))


class GCSStore:
    def __init__(self, cfg: GCSConfig, client=None) -> None:
        self.cfg = cfg
        self._client = client or _client(cfg)
        self._bucket = self._client.bucket(cfg.bucket)
        self._signer = _signing_credentials(cfg) if cfg.signed_url_ttl_s else None

    # ------------------------------------------------------------ start-up

    def check_writable(self) -> None:
        """The bucket exists and this worker can create and delete objects in it."""
        try:
            self._retrying(lambda: self._client.get_bucket(self.cfg.bucket, timeout=self.cfg.timeout_s, retry=None))
        except gx.NotFound:
            raise StorageConfigError(f"storage.gcs.bucket: bucket {self.cfg.bucket!r} does not exist") from None
        except gx.Forbidden as e:
            raise StorageConfigError(f"storage.gcs.bucket: no access to bucket {self.cfg.bucket!r}: {e.message}") from None
        except StorageUnavailable as e:
            raise StorageConfigError(f"storage.gcs: cannot reach bucket {self.cfg.bucket!r}: {e}") from None
        probe = self._bucket.blob(f"{self.cfg.prefix}/.dit-worker-probe-{uuid.uuid4().hex}")
        try:
            self._retrying(lambda: probe.upload_from_string(b"", if_generation_match=0, timeout=self.cfg.timeout_s,
                                                            retry=None))
            self._retrying(lambda: probe.delete(timeout=self.cfg.timeout_s, retry=None))
        except (gx.Forbidden, gx.Unauthorized) as e:
            raise StorageConfigError(f"storage.gcs.bucket: cannot write to bucket {self.cfg.bucket!r}: "
                                     f"{e.message}") from None
        except StorageUnavailable as e:
            raise StorageConfigError(f"storage.gcs: cannot write to bucket {self.cfg.bucket!r}: {e}") from None

    # ------------------------------------------------------------ per task

    def object_name(self, item: Artifact, model: str = "") -> str:
        day = dt.datetime.fromtimestamp(item.created_at, dt.timezone.utc)
        return self.cfg.object_name.format(prefix=self.cfg.prefix, yyyy=f"{day.year:04d}", mm=f"{day.month:02d}",
                                           dd=f"{day.day:02d}", task_id=item.stem, ext=item.ext,
                                           model=model).lstrip("/")

    def put(self, item: Artifact) -> StoredObject:
        name = self.object_name(item, item.metadata.get("model", ""))
        md5 = base64.b64encode(hashlib.md5(item.data).digest()).decode()
        blob = self._bucket.blob(name)
        blob.cache_control = self.cfg.cache_control
        blob.metadata = {**item.metadata, "sha256": item.sha256}
        try:
            # checksum="md5": the request carries the MD5 and GCS refuses bytes that do not match it.
            self._retrying(lambda: blob.upload_from_string(
                item.data, content_type=item.content_type, if_generation_match=0,
                timeout=self.cfg.timeout_s, retry=None, checksum="md5"))
        except gx.PreconditionFailed:
            return self._earlier_attempt(name, item)
        if blob.md5_hash != md5:
            self._delete_corrupt(blob)
            raise UploadCorrupted(f"gs://{self.cfg.bucket}/{name}: stored MD5 {blob.md5_hash} is not {md5}; "
                                  "the object was deleted")
        return StoredObject(uri=f"gs://{self.cfg.bucket}/{name}", bytes=len(item.data), sha256=item.sha256,
                            url=self._sign(blob))

    def remove(self, uri: str) -> None:
        bucket, _, name = uri.removeprefix("gs://").partition("/")
        if bucket != self.cfg.bucket or not name:
            raise ValueError(f"{uri} is not an object of gs://{self.cfg.bucket}")
        try:
            self._retrying(lambda: self._bucket.blob(name).delete(timeout=self.cfg.timeout_s, retry=None))
        except gx.NotFound:
            pass

    def _earlier_attempt(self, name: str, item: Artifact) -> StoredObject:
        """The object an earlier attempt of this task stored: the task's result."""
        existing = self._retrying(lambda: self._bucket.get_blob(name, timeout=self.cfg.timeout_s, retry=None))
        if existing is None:  # deleted between our 412 and this read: do not guess, retry the task
            raise StorageUnavailable(f"gs://{self.cfg.bucket}/{name} vanished after a 412")
        meta = existing.metadata or {}
        if meta.get("task_id") != item.task_id or "sha256" not in meta:
            raise ObjectConflict(f"gs://{self.cfg.bucket}/{name} holds an object this task did not store "
                                 f"(task_id {meta.get('task_id')!r}); not overwritten")
        log.info("task %s: an earlier attempt stored gs://%s/%s; it is the result", item.task_id,
                 self.cfg.bucket, name)
        return StoredObject(uri=f"gs://{self.cfg.bucket}/{name}", bytes=existing.size, sha256=meta["sha256"],
                            url=self._sign(existing))

    def _delete_corrupt(self, blob) -> None:
        """Best effort, and only the generation this upload made; a failure is logged, and the retry's
        412 then finds an object whose sha256 metadata describes bytes it does not hold."""
        try:
            self._retrying(lambda: blob.delete(if_generation_match=blob.generation, timeout=self.cfg.timeout_s,
                                               retry=None))
        except Exception:
            log.exception("could not delete the corrupt object %s", blob.name)

    def _sign(self, blob) -> str | None:
        if self._signer is None:
            return None
        return blob.generate_signed_url(version="v4", method="GET", credentials=self._signer,
                                        expiration=dt.timedelta(seconds=self.cfg.signed_url_ttl_s))

    def _retrying(self, call):
        retrying = Retrying(
            retry=retry_if_exception(_transient),
            wait=wait_random_exponential(multiplier=self.cfg.backoff_initial_s, max=self.cfg.backoff_max_s),
            stop=stop_after_delay(self.cfg.deadline_s),
            reraise=False,
        )
        try:
            return retrying(call)
        except RetryError as e:
            last = e.last_attempt.exception()
            raise StorageUnavailable(f"GCS unavailable for {self.cfg.deadline_s:.0f}s: "
                                     f"{type(last).__name__}: {last}") from last


def _client(cfg: GCSConfig):
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project=cfg.project or "emulator", credentials=AnonymousCredentials())
    if cfg.credentials_file:
        return storage.Client.from_service_account_json(cfg.credentials_file, project=cfg.project)
    return storage.Client(project=cfg.project)  # Application Default Credentials


def _signing_credentials(cfg: GCSConfig):
    """V4 signing needs a private key: the service-account key file. (ADC on GCE can sign through
    the IAM API, which this worker does not call.)"""
    if not cfg.credentials_file:
        raise StorageConfigError("storage.gcs.signed_url_ttl_s: signing URLs needs storage.gcs.credentials_file "
                                 "(a service-account key)")
    from google.oauth2 import service_account

    try:
        return service_account.Credentials.from_service_account_file(cfg.credentials_file)
    except (OSError, ValueError) as e:
        raise StorageConfigError(f"storage.gcs.credentials_file: {e}") from e
