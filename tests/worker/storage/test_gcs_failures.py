"""The GCS store when storage fails: retried with backoff within a deadline, then unavailable;
never a success without a stored, verified object."""

from __future__ import annotations

import base64
import hashlib
import threading
import time

import pytest
from google.api_core import exceptions as gx

from tests.harness import Emulator
from worker.config import GCSConfig
from worker.storage.gcs import GCSStore, _transient
from worker.storage import Artifact, StorageUnavailable, UploadCorrupted

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


@pytest.fixture
def gcs(tmp_path, monkeypatch):
    emu = Emulator(tmp_path, persistent=True)  # the bucket survives a restart
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.url)
    emu.bucket("results")
    yield emu
    emu.stop()


def _timeout_408():
    err = gx.ClientError("request timeout")
    err.code = 408
    return err


def art() -> Artifact:
    return Artifact("t1", b"png bytes", "image/png", 0.0, {"task_id": "t1"})


@pytest.mark.parametrize("exc, transient", [
    (gx.TooManyRequests("x"), True), (gx.ServiceUnavailable("x"), True), (gx.InternalServerError("x"), True),
    (gx.GatewayTimeout("x"), True), (_timeout_408(), True), (ConnectionError(), True),
    (gx.Forbidden("x"), False), (gx.NotFound("x"), False), (gx.PreconditionFailed("x"), False),
    (gx.BadRequest("x"), False),
])
def test_which_errors_are_retried(exc, transient):
    assert _transient(exc) is transient


def test_storage_down_past_the_deadline_is_unavailable(gcs):
    store = GCSStore(GCSConfig(bucket="results", deadline_s=1.5, backoff_initial_s=0.1, backoff_max_s=0.5,
                               timeout_s=1.0))
    gcs.stop()
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailable, match="GCS unavailable for 2s: ConnectionError"):
        store.put(art())
    assert 1.5 <= time.monotonic() - t0 < 6


def test_storage_back_within_the_deadline_succeeds(gcs):
    store = GCSStore(GCSConfig(bucket="results", deadline_s=20.0, backoff_initial_s=0.1, backoff_max_s=0.5,
                               timeout_s=1.0))
    gcs.stop()

    back = threading.Timer(1.0, gcs.start)  # back within the store's deadline
    back.start()
    obj = store.put(art())
    back.join()  # the put may succeed before start() returns: the teardown must see the new process
    assert gcs.bucket("results").get_blob("results/1970/01/01/t1.png").download_as_bytes() == b"png bytes"
    assert obj.uri == "gs://results/results/1970/01/01/t1.png"


def test_a_corrupt_upload_is_deleted_and_fails_retryable(gcs, monkeypatch):
    # Bytes damaged on the way: the request's MD5 is the worker's, the body is not. Real GCS refuses
    # such an upload itself (400); the emulator stores it, so the check after the upload must catch it.
    from google.cloud.storage import Blob

    real_upload = Blob.upload_from_string

    def damaged(self, data, *args, checksum=None, **kw):
        self.md5_hash = base64.b64encode(hashlib.md5(data).digest()).decode()
        return real_upload(self, data[:-1] + b"X", *args, checksum=None, **kw)

    monkeypatch.setattr(Blob, "upload_from_string", damaged)
    store = GCSStore(GCSConfig(bucket="results", deadline_s=5.0))
    with pytest.raises(UploadCorrupted, match="stored MD5 .* is not .*; the object was deleted"):
        store.put(art())
    assert list(gcs.client().list_blobs("results")) == []  # nothing corrupt left for a retry to take
    monkeypatch.setattr(Blob, "upload_from_string", real_upload)
    assert store.put(art()).sha256 == hashlib.sha256(b"png bytes").hexdigest()  # the retry stores it
