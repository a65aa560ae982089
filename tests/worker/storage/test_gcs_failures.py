"""The GCS store when storage fails: retried with backoff within a deadline, then unavailable;
never a success without a stored, verified object."""

from __future__ import annotations

import threading
import time

import pytest
from google.api_core import exceptions as gx

from tests.harness import Emulator
from worker.config import GCSConfig
from worker.storage.gcs import GCSStore, _transient
from worker.storage import Artifact, StorageUnavailable


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
    return Artifact("t1", b"png bytes", "image/png", 0.0)


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

    threading.Timer(1.0, gcs.start).start()  # back within the store's deadline
    obj = store.put(art())
    assert gcs.bucket("results").get_blob("results/1970/01/01/t1.png").download_as_bytes() == b"png bytes"
    assert obj.uri == "gs://results/results/1970/01/01/t1.png"
