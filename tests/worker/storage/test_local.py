import hashlib
import os
import stat

import pytest

from worker.config import LocalStorageConfig, StorageConfig
from worker.storage import Artifact, LocalStore, StorageConfigError, build_store


def art(task_id, data, content_type="image/png"):
    return Artifact(task_id, data, content_type, created_at=0.0)


def test_put_writes_named_by_task_id(tmp_path):
    store = LocalStore(tmp_path)
    obj = store.put(art("task1", b"\x89PNG..."))
    path = tmp_path / "task1.png"
    assert path.read_bytes() == b"\x89PNG..." and obj.uri == path.resolve().as_uri()
    assert obj.bytes == 7 and obj.sha256 == hashlib.sha256(b"\x89PNG...").hexdigest()


def test_a_retry_takes_the_earlier_attempts_object_and_leaves_no_temp_file(tmp_path):
    store = LocalStore(tmp_path)
    first = store.put(art("task1", b"first"))
    again = store.put(art("task1", b"second attempt"))
    assert again == first and again.sha256 == hashlib.sha256(b"first").hexdigest()
    assert [p.name for p in tmp_path.iterdir()] == ["task1.png"]
    assert (tmp_path / "task1.png").read_bytes() == b"first"


def test_check_writable_creates_the_root(tmp_path):
    LocalStore(tmp_path / "a" / "b").check_writable()
    assert (tmp_path / "a" / "b").is_dir() and not list((tmp_path / "a" / "b").iterdir())


def test_check_writable_fails_clearly(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    # A config error naming the field, which the worker refuses to start on (and node.sh does not
    # restart), not an OSError crash that torchrun would restart for ever.
    with pytest.raises(StorageConfigError, match=r"local.root: cannot write to .*/file/out: Not a directory"):
        LocalStore(tmp_path / "file" / "out").check_writable()


def test_build_store(tmp_path):
    store = build_store(StorageConfig(local=LocalStorageConfig(root=str(tmp_path))))
    assert isinstance(store, LocalStore) and store.root == tmp_path.resolve()


def test_extension_follows_the_content_type(tmp_path):
    store = LocalStore(tmp_path)
    assert store.put(art("a", b"x", "image/webp")).uri.endswith("/a.webp")
    assert store.put(art("b", b"x", "image/jpeg")).uri.endswith("/b.jpg")


def test_remove_deletes_this_stores_object_and_nothing_outside_it(tmp_path):
    store = LocalStore(tmp_path / "results")
    store.check_writable()
    obj = store.put(art("task1", b"x"))
    outside = tmp_path / "keep.png"
    outside.write_bytes(b"y")
    with pytest.raises(ValueError, match="is not an object of"):
        store.remove(outside.as_uri())
    with pytest.raises(ValueError):
        store.remove((tmp_path / "results" / ".." / "keep.png").as_uri())
    store.remove(obj.uri)
    store.remove(obj.uri)  # gone already is fine
    assert outside.exists() and not (tmp_path / "results" / "task1.png").exists()


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_objects_are_as_readable_as_the_umask_allows(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        obj = LocalStore(tmp_path).put(art("task1", b"x"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "task1.png").stat().st_mode) == mode and obj.uri.endswith("/task1.png")
