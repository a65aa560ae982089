"""The wheelhouse refuses what it cannot check."""

from __future__ import annotations

import pytest

from release.wheelhouse import pinned_requirements


def test_a_file_the_index_gave_no_sha256_for_is_refused_by_name():
    item = {"metadata": {"name": "unhashed", "version": "1.0"},
            "download_info": {"url": "https://files.example/unhashed-1.0-py3-none-any.whl", "archive_info": {}}}
    with pytest.raises(SystemExit, match="unhashed: the index gave no sha256"):
        pinned_requirements([item])
