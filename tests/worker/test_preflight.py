"""`dit-worker check`: what node.sh runs before torchrun, so that no restart loop starts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from worker.preflight import EXIT_PERMANENT, check

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "tiny.toml")


def test_a_sound_config_passes():
    assert check(TINY, ["ops.port=0"]) == 0


def test_a_typo_names_the_key(capsys):
    assert check(TINY, ["queue.lease_wiat_s=3"]) == EXIT_PERMANENT
    assert "lease_wiat_s" in capsys.readouterr().err


def test_a_wrong_type_names_the_field(capsys):
    assert check(TINY, ['queue.lease_wait_s="soon"']) == EXIT_PERMANENT
    assert "queue.lease_wait_s" in capsys.readouterr().err


@pytest.mark.integration
def test_a_taken_ops_port_names_the_field(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert check(TINY, ["ops.host=127.0.0.1", f"ops.port={port}"]) == EXIT_PERMANENT
    assert f"ops.port: cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_a_cuda_model_without_cuda_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert check(TINY, ['model.device="cuda"']) == EXIT_PERMANENT
    assert "model.device: cuda requested but no CUDA device is visible" in capsys.readouterr().err
