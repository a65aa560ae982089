import hashlib

import pytest

from worker.config import LocalStorageConfig, StorageConfig
from worker.storage import LocalStore, build_store


def test_put_writes_named_by_task_id(tmp_path):
    store = LocalStore(tmp_path)
    obj = store.put("task1", b"\x89PNG...", "image/png")
    path = tmp_path / "task1.png"
    assert path.read_bytes() == b"\x89PNG..." and obj.uri == path.resolve().as_uri()
    assert obj.bytes == 7 and obj.sha256 == hashlib.sha256(b"\x89PNG...").hexdigest()


def test_retry_overwrites_instead_of_duplicating(tmp_path):
    store = LocalStore(tmp_path)
    store.put("task1", b"first", "image/png")
    store.put("task1", b"second", "image/png")
    assert [p.name for p in tmp_path.iterdir()] == ["task1.png"]
    assert (tmp_path / "task1.png").read_bytes() == b"second"


def test_check_writable_creates_the_root(tmp_path):
    LocalStore(tmp_path / "a" / "b").check_writable()
    assert (tmp_path / "a" / "b").is_dir() and not list((tmp_path / "a" / "b").iterdir())


def test_check_writable_fails_clearly(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(OSError):
        LocalStore(tmp_path / "file" / "out").check_writable()


def test_build_store(tmp_path):
    store = build_store(StorageConfig(local=LocalStorageConfig(root=str(tmp_path))))
    assert isinstance(store, LocalStore) and store.root == tmp_path.resolve()
