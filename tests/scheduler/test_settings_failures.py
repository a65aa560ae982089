"""Settings the scheduler cannot run with are refused at start, before the database is touched: one
line naming the file and the field, exit code 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launch.local import REPO
from scheduler.__main__ import main
from scheduler.config import ConfigError, load_config

TOKENS = {"DIT_WORKER_TOKENS": "w", "DIT_CLIENT_TOKENS": "c"}


def refusal(tmp_path, text: str, environ: dict[str, str] | None = None, **kw) -> str:
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path, environ={} if environ is None else environ, **kw)
    return str(e.value)


@pytest.mark.parametrize("text, message", [
    ("[store]\nlease_tll_s = 5\n", "store.lease_tll_s: unknown key"),
    ("[sever]\nport = 1\n", "sever: unknown key"),
    ("extends = 3\n", "extends: expected a file name"),
    ('[server]\nport = "8700"\n', "server.port: Input should be a valid integer"),
    ("[api.gate]\nadmit_unservable = 1\n", "api.gate.admit_unservable: Input should be a valid boolean"),
    ('[api.webhooks]\nallow = "a.example"\n', "api.webhooks.allow: Input should be a valid tuple"),
    ('[logging]\nformat = "xml"\n', "logging.format: Input should be 'auto', 'json' or 'text'"),
    ("[server]\nport = 70000\n", "server.port: Input should be less than or equal to 65535"),
    ("[store]\nlease_ttl_s = 0\n", "store.lease_ttl_s: Input should be greater than 0"),
    ("[store]\nmax_attempts = 0\n", "store.max_attempts: Input should be greater than or equal to 1"),
    ("[database]\npool_size = 0\n", "database.pool_size: Input should be greater than or equal to 1"),
    ('[database]\nurl = ""\n', "database.url: String should have at least 1 character"),
    ("[api.gate]\nrate_limit = -1\n", "api.gate.rate_limit: Input should be greater than or equal to 0"),
    ("[api.gate]\nrate_limit = 2\nrate_burst = 0.5\n", "api.gate.rate_burst: under 1, no task could ever be submitted"),
    # A key under its old name is read under its new one, and named so when it is wrong.
    ("[api]\nrate_limit = -1\n", "api.gate.rate_limit: Input should be greater than or equal to 0"),
    ("[server]\nstuck_loop_s = 5\n", "server.stuck_loop_s: 5s would restart a scheduler waiting out a busy database "
     "(database.busy_timeout_s = 10s)"),
    ("[server]\nstuck_loop_s = 2\n[database]\nbusy_timeout_s = 2\n", "server.stuck_loop_s: 2s would restart"),
    ("[server]\nshutdown_s = 0\n", "server.shutdown_s: Input should be greater than 0"),
    ("[database]\nbusy_timeout_s = 0\n", "database.busy_timeout_s: Input should be greater than 0"),
])
def test_each_mistake_in_a_file_names_file_and_field(tmp_path, text, message):
    assert refusal(tmp_path, text).startswith(f"{tmp_path / 's.toml'}: {message}")


def test_auth_off_only_on_loopback(tmp_path):
    msg = refusal(tmp_path, '[server]\nhost = "0.0.0.0"\n', {"DIT_WORKER_TOKENS": "w"})
    assert msg.endswith("server.host: refusing to listen on 0.0.0.0 without auth: set DIT_WORKER_TOKENS and "
                        "DIT_CLIENT_TOKENS (comma-separated tokens)")
    assert load_config(tmp_path / "s.toml", environ=TOKENS).server.host == "0.0.0.0"
    renamed = refusal(tmp_path, '[server]\nhost = "0.0.0.0"\n[api.auth]\nclient_tokens_env = "MINE"\n', TOKENS)
    assert "set DIT_WORKER_TOKENS and MINE" in renamed  # the variable the file names, not the default's


def test_webhooks_need_a_signing_key(tmp_path):
    msg = refusal(tmp_path, '[api.webhooks]\nallow = ["hooks.example.com"]\n')
    assert "api.webhooks.allow: webhooks need a signing key: set DIT_WEBHOOK_SECRET" in msg
    assert load_config(tmp_path / "s.toml", environ={"DIT_WEBHOOK_SECRET": "k"}).api.webhooks.allow


def test_overrides_and_flags_name_where_the_value_came_from(tmp_path):
    assert refusal(tmp_path, "", overrides=["api.gate.max_queud=3"]).endswith(
        "api.gate.max_queud: unknown key (from --set)")
    assert refusal(tmp_path, "", overrides=["api.max_queued=-1"]).endswith(  # its old name, moved with its origin
        "api.gate.max_queued: Input should be greater than or equal to 0 (from --set)")
    assert refusal(tmp_path, "", flags={"server.port": ("--port", -1)}).endswith(
        "server.port: Input should be greater than or equal to 0 (from --port)")
    assert refusal(tmp_path, "", overrides=["nothing"]).endswith("--set 'nothing': expected section.key=value")
    assert refusal(tmp_path, "[server]\nport = 1\n", overrides=["server.port.x=1"]).endswith(
        "server.port.x: port is not a section")
    assert refusal(tmp_path, "", overrides=["server.port.x=1"]).endswith(
        "server.port: Input should be a valid integer (from --set)")
    both = refusal(tmp_path, "", overrides=["server.port=1"], flags={"server.port": ("--port", 2)})
    assert both.endswith("server.port: set by both --port and --set; keep one")
    with pytest.raises(ConfigError, match=r"^\(command line\): api.gate.max_queued: .* \(from --api-gate-max-queued\)$"):
        load_config(flags={"api.gate.max_queued": ("--api-gate-max-queued", -1)}, environ={})


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match=r"nope.toml: cannot read: No such file or directory$"):
        load_config(tmp_path / "nope.toml")
    assert "s.toml: not valid TOML: " in refusal(tmp_path, "[server\nport = 1\n")
    (tmp_path / "a.toml").write_text('extends = "s.toml"\n')
    assert refusal(tmp_path, 'extends = "a.toml"\n').endswith("extends: s.toml extends itself")


def test_the_cli_refuses_in_one_line_before_touching_the_database(tmp_path, capsys):
    (tmp_path / "s.toml").write_text("[store]\nlease_tll_s = 5\n")
    db = tmp_path / "x.db"
    assert main(["--config", str(tmp_path / "s.toml"), "--database-url", str(db)]) == 2
    assert capsys.readouterr().err == f"scheduler: {tmp_path / 's.toml'}: store.lease_tll_s: unknown key\n"
    assert not db.exists()


@pytest.mark.parametrize("argv, line", [
    (["--config", "configs/scheduler.toml", "--set", "server.port=70000"],
     "scheduler: configs/scheduler.toml: server.port: Input should be less than or equal to 65535 (from --set)"),
    (["--store-lease-ttl-s", "-1"], "scheduler: (command line): store.lease_ttl_s: Input should be greater than 0 "
     "(from --store-lease-ttl-s)"),
    (["--lease-ttl", "-1"], "scheduler: (command line): store.lease_ttl_s: Input should be greater than 0 "
     "(from --lease-ttl)"),  # its old name: still a flag for one release
])
@pytest.mark.integration
def test_python_m_scheduler_exits_2_with_one_line(tmp_path, argv, line):
    out = subprocess.run([sys.executable, "-m", "scheduler", "--database-url", str(tmp_path / "s.db"), *argv], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr, out.stdout) == (2, line + "\n", "")
    assert not (tmp_path / "s.db").exists()
