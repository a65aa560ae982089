"""The GCS store against a real emulator (fake-gcs-server on 127.0.0.1) with the official client."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from urllib.parse import parse_qs, urlparse

import pytest

from tests.harness import Emulator
from worker.config import GCSConfig
from worker.storage.gcs import GCSStore
from worker.storage import Artifact, ObjectConflict, StorageConfigError

CREATED = dt.datetime(2026, 1, 2, 23, 59, tzinfo=dt.timezone.utc).timestamp()


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    emu = Emulator(tmp_path_factory.mktemp("gcs"))
    yield emu
    emu.stop()


@pytest.fixture
def gcs(emulator, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
    return emulator


def store(gcs, bucket="results", **kw) -> GCSStore:
    gcs.bucket(bucket)
    return GCSStore(GCSConfig(bucket=bucket, deadline_s=2.0, **kw))


def art(task_id="t1", data=b"\x89PNG fake", meta=None) -> Artifact:
    return Artifact(task_id, data, "image/png", CREATED, meta or {"task_id": task_id, "seed": "7", "model": "tiny"})


def test_put_stores_bytes_content_type_and_metadata(gcs):
    obj = store(gcs, cache_control="private, max-age=60").put(art())
    assert obj.uri == "gs://results/results/2026/01/02/t1.png" and obj.url is None
    blob = gcs.bucket("results").get_blob("results/2026/01/02/t1.png")
    assert blob.download_as_bytes() == b"\x89PNG fake"
    assert blob.content_type == "image/png" and blob.cache_control == "private, max-age=60"
    assert blob.metadata == {"task_id": "t1", "seed": "7", "model": "tiny",
                             "sha256": hashlib.sha256(b"\x89PNG fake").hexdigest()}
    assert blob.md5_hash == base64.b64encode(hashlib.md5(b"\x89PNG fake").digest()).decode()
    assert obj.sha256 == blob.metadata["sha256"] and obj.bytes == blob.size


def test_object_name_template(gcs):
    s = store(gcs, prefix="imgs", object_name="{prefix}/{model}/{task_id}.{ext}")
    assert s.put(art("t2")).uri == "gs://results/imgs/tiny/t2.png"


def test_a_tasks_other_images_are_named_after_it_with_their_index(gcs):
    s = store(gcs, bucket="several", prefix="imgs", object_name="{prefix}/{model}/{task_id}.{ext}")
    uris = [s.put(Artifact("t9", f"image {i}".encode(), "image/png", CREATED, {"task_id": "t9", "model": "tiny"},
                           index=i)).uri for i in range(3)]
    assert uris == ["gs://several/imgs/tiny/t9.png", "gs://several/imgs/tiny/t9~1.png", "gs://several/imgs/tiny/t9~2.png"]
    # A retry of image 1 finds it (its task's own), not image 0's.
    again = s.put(Artifact("t9", b"other bytes", "image/png", CREATED, {"task_id": "t9", "model": "tiny"}, index=1))
    assert again.uri == uris[1] and again.sha256 == hashlib.sha256(b"image 1").hexdigest()


def test_a_duplicate_upload_of_the_same_bytes_succeeds_and_leaves_one_object(gcs):
    s = store(gcs, bucket="dupes")
    first, second = s.put(art("t3")), s.put(art("t3"))
    assert first == second
    assert [b.name for b in gcs.client().list_blobs("dupes")] == ["results/2026/01/02/t3.png"]


def test_a_retry_with_other_bytes_takes_the_earlier_attempts_object(gcs):
    # Attempts need not be byte-identical (batch size, ranks and threads change the kernels): the
    # object stored first passed its checks and is the result; it is never overwritten.
    s = store(gcs, bucket="retries")
    first = s.put(art("t4", b"first"))
    again = s.put(art("t4", b"second attempt"))
    assert again == first and again.sha256 == hashlib.sha256(b"first").hexdigest() and again.bytes == 5
    assert gcs.bucket("retries").get_blob("results/2026/01/02/t4.png").download_as_bytes() == b"first"
    assert [b.name for b in gcs.client().list_blobs("retries")] == ["results/2026/01/02/t4.png"]


def test_an_object_this_task_did_not_store_is_a_conflict_not_overwritten(gcs):
    s = store(gcs, bucket="conflicts")
    foreign = gcs.bucket("conflicts").blob("results/2026/01/02/t5.png")
    foreign.metadata = {"task_id": "someone-else"}
    foreign.upload_from_string(b"not ours")
    with pytest.raises(ObjectConflict, match="holds an object this task did not store .task_id 'someone-else'"):
        s.put(art("t5", b"ours"))
    assert gcs.bucket("conflicts").get_blob("results/2026/01/02/t5.png").download_as_bytes() == b"not ours"


def test_check_writable_passes_and_leaves_nothing_behind(gcs):
    s = store(gcs, bucket="probed")
    s.check_writable()
    assert list(gcs.client().list_blobs("probed")) == []


def test_a_missing_bucket_is_named(gcs):
    s = GCSStore(GCSConfig(bucket="no-such-bucket", deadline_s=2.0))
    with pytest.raises(StorageConfigError, match="bucket 'no-such-bucket' does not exist"):
        s.check_writable()


def test_signed_url_v4_with_a_service_account_key(gcs, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    key_file = tmp_path / "sa.json"
    key_file.write_text(json.dumps({
        "type": "service_account", "project_id": "test", "private_key_id": "k1", "private_key": pem,
        "client_email": "worker@test.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token"}))
    obj = store(gcs, credentials_file=str(key_file), signed_url_ttl_s=900).put(art("t5"))
    query = parse_qs(urlparse(obj.url).query)
    assert query["X-Goog-Algorithm"] == ["GOOG4-RSA-SHA256"] and query["X-Goog-Expires"] == ["900"]
    assert query["X-Goog-Credential"][0].startswith("worker@test.iam.gserviceaccount.com/")
    assert "t5.png" in urlparse(obj.url).path


def test_signing_without_a_key_file_is_refused_at_start(gcs):
    with pytest.raises(StorageConfigError, match="needs storage.gcs.credentials_file"):
        store(gcs, signed_url_ttl_s=60)


def test_remove_deletes_the_object_and_refuses_another_buckets(gcs):
    s = store(gcs)
    obj = s.put(art("t-rm"))
    s.remove(obj.uri)
    s.remove(obj.uri)  # gone already is fine
    assert gcs.bucket("results").get_blob(obj.uri.removeprefix("gs://results/")) is None
    with pytest.raises(ValueError, match="is not an object of gs://results"):
        s.remove("gs://other/results/x.png")
