"""The wheelhouse's own logic, without the network: the target's tags, what the node has, which
requirements a resolved set places on a package, the stand-in torch."""

from __future__ import annotations

import zipfile

import pytest

from release.wheelhouse import (
    Target,
    fits,
    manylinux_tags,
    pinned_requirements,
    read_have,
    requirements_on,
    stand_in_torch,
)


def test_manylinux_tags_run_from_the_nodes_glibc_down_with_the_legacy_aliases():
    tags = manylinux_tags("x86_64", "2.28")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_5_x86_64" in tags
    assert "manylinux_2_29_x86_64" not in tags  # newer than the node: would not load there
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux1_aarch64" not in manylinux_tags("aarch64", "2.28")  # never existed
    with pytest.raises(SystemExit, match="--glibc"):
        manylinux_tags("x86_64", "2.12")


def test_target_pip_arguments_and_markers():
    target = Target("3.12", ["manylinux_2_28_x86_64"], "x86_64")
    args = target.pip_args()
    assert args[:1] == ["--only-binary=:all:"] and ["--abi", "cp312"] == args[args.index("--abi"):][:2]
    env = target.marker_env()
    assert env["python_version"] == "3.12" and env["sys_platform"] == "linux" and env["platform_machine"] == "x86_64"


def test_have_reads_pip_freeze_and_bare_names(tmp_path):
    f = tmp_path / "have.txt"
    f.write_text("# from the node\nNumPy==2.5.2\nscikit_learn\n-e git+https://x/y#egg=z\nfoo @ file:///x.whl\n\n")
    assert read_have(f) == {"numpy": "2.5.2", "scikit-learn": None}


def item(name: str, version: str, *requires: str) -> dict:
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


def test_requirements_follow_markers_and_extras_the_way_pip_resolved_them():
    items = [
        item("dit-worker", "0.1.0", "uvicorn[standard]>=0.29", "torchao>=0.14; extra == 'fp8'",
             "pywin32; sys_platform == 'win32'"),
        item("uvicorn", "0.54.0", "h11>=0.8", "httptools>=0.6.3; extra == 'standard'"),
        item("httptools", "0.9.0"), item("h11", "0.16.0"), item("torchao", "0.18.0"),
    ]
    env = Target("3.12", [], "x86_64").marker_env()
    specs = requirements_on(items, ["fp8"], env)
    assert [str(s) for s in specs["httptools"]] == [">=0.6.3"]  # reached through uvicorn's extra
    assert [str(s) for s in specs["torchao"]] == [">=0.14"]
    assert "pywin32" not in specs  # not on Linux
    assert requirements_on(items, [], env)["torchao"] == []  # the extra not asked for: nothing requires it


def test_what_the_node_has_stands_in_only_where_it_fits():
    specs = requirements_on([item("a", "1", "numpy>=1.26,<3", "scikit-learn==1.9.1")], [],
                            Target("3.12", [], "x86_64").marker_env())
    assert fits("2.5.2", specs["numpy"]) and not fits("1.24.0", specs["numpy"])
    assert fits(None, specs["numpy"])  # a bare name against a range: trusted
    assert not fits(None, specs["scikit-learn"])  # ... never against an exact pin
    assert fits("1.9.1", specs["scikit-learn"])


def test_the_stand_in_torch_is_metadata_only_with_the_local_label(tmp_path):
    version = stand_in_torch("2.11.0+cu130", tmp_path)
    assert version == "2.11.0+wheelhouse"
    with zipfile.ZipFile(tmp_path / "torch-2.11.0+wheelhouse-py3-none-any.whl") as z:
        assert all(".dist-info/" in n for n in z.namelist())  # no code: it must never be installed
        metadata = z.read("torch-2.11.0+wheelhouse.dist-info/METADATA").decode()
    assert "Version: 2.11.0+wheelhouse" in metadata and "Requires-Dist" not in metadata


def resolved(name: str, url: str, sha256: str | None) -> dict:
    hashes = {"sha256": sha256} if sha256 else {}
    return {"metadata": {"name": name, "version": "1.0"}, "download_info": {"url": url, "archive_info": {"hashes": hashes}}}


def test_the_download_asks_for_the_resolved_files_by_url_and_hash():
    items = [resolved("numpy", "https://files.example/numpy-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", "ab" * 32),
             resolved("h11", "file:///opt/pypi/files/h11-1.0-py3-none-any.whl", "cd" * 32)]
    assert pinned_requirements(items) == [
        f"numpy @ https://files.example/numpy-1.0-cp312-cp312-manylinux_2_28_x86_64.whl --hash=sha256:{'ab' * 32}",
        f"h11 @ file:///opt/pypi/files/h11-1.0-py3-none-any.whl --hash=sha256:{'cd' * 32}"]
