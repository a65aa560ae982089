"""The scheduler's settings tree: its defaults are the flags' old defaults, the shipped file equals
them, a file, --set and the flags stack in that order, and every flag the scheduler has always had
sets its field. The app takes the api section as it is, and the secrets it names."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import pytest

from launch.local import REPO
from scheduler.__main__ import parse_args
from scheduler.app import create_app
from scheduler.config import FLAGS, ApiConfig, Secrets, SchedulerConfig, flag_values, load_config, read_secrets
from scheduler.config.flags import field_of
from scheduler.store import open_store

SHIPPED = REPO / "configs" / "scheduler.toml"
SECRETS = {"worker_tokens", "client_tokens", "webhook_secret"}


def load(argv: list[str], environ: dict[str, str] | None = None) -> SchedulerConfig:
    """What `python -m scheduler ARGV` would run with."""
    args = parse_args(argv)
    return load_config(args.config, args.set, flag_values(args), environ={} if environ is None else environ)


def test_defaults_are_the_old_flag_defaults():
    cfg = load([])
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8700)
    assert (cfg.database.url, cfg.database.pool_size) == ("var/scheduler.db", 4)
    assert dict(cfg.store) == {"lease_ttl_s": 60.0, "max_attempts": 3, "liveness_s": 90.0,
                               "retention_s": 86400.0, "task_retention_s": 7 * 86400.0}
    assert (cfg.api.worker_tokens_env, cfg.api.client_tokens_env, cfg.api.webhook_secret_env) == (
        "DIT_WORKER_TOKENS", "DIT_CLIENT_TOKENS", "DIT_WEBHOOK_SECRET")
    assert (cfg.logging.level, cfg.logging.format) == ("INFO", "auto")
    assert cfg.api == ApiConfig()


def test_the_app_takes_the_api_section_and_the_secrets_as_they_are():
    # One definition of each setting: no second copy of the fields for the app to drift from.
    params = inspect.signature(create_app).parameters
    settings = [p for p in list(params.values())[1:] if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert [(p.name, p.annotation, p.default) for p in settings] == [
        ("api", "ApiConfig", ApiConfig()), ("secrets", "Secrets", Secrets())]
    # The rest are the process's own objects (its metrics, its stop), never a setting.
    assert {p.name for p in params.values() if p.kind is inspect.Parameter.KEYWORD_ONLY} == {"metrics", "stop"}
    assert {f for f in vars(Secrets()) if not f.startswith("_")} == SECRETS
    assert not SECRETS & set(ApiConfig.model_fields)


def test_the_store_section_is_open_stores_keywords(tmp_path):
    cfg = load(["--set", "store.lease_ttl_s=5", "--db", str(tmp_path / "s.db")])
    store = open_store(cfg.database.url, pool_size=cfg.database.pool_size, **dict(cfg.store))
    store.close()


def test_the_shipped_file_is_the_defaults_and_names_every_field():
    assert load(["--config", str(SHIPPED)]) == load([])
    raw = tomllib.loads(SHIPPED.read_text())
    for section, model in SchedulerConfig.model_fields.items():
        assert set(raw[section]) == set(model.annotation.model_fields), section


def test_file_then_set_then_flags(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text('[server]\nport = 9000\nhost = "localhost"\n[api]\nmax_queued = 5\nwebhook_allow = ["a.example"]\n')
    top = tmp_path / "top.toml"
    top.write_text('extends = "base.toml"\n[api]\nmax_queued = 7\n[logging]\nlevel = "debug"\n')
    cfg = load(["--config", str(top), "--set", "api.poll_s=2", "--set", "database.url=postgresql://dit@db/dit",
                "--port", "9100", "--webhook-allow", "b.example"], {"DIT_WEBHOOK_SECRET": "k"})
    assert (cfg.server.host, cfg.server.port) == ("localhost", 9100)  # the file, then the flag
    assert (cfg.api.max_queued, cfg.api.poll_s, cfg.logging.level) == (7, 2.0, "DEBUG")
    assert cfg.database.url == "postgresql://dit@db/dit"
    assert cfg.api.webhook_allow == ("b.example",)  # a repeatable flag replaces the file's list
    assert cfg.store == load([]).store  # what nobody set keeps its default


def test_secrets_come_from_the_variables_the_api_section_names():
    cfg = load(["--worker-tokens-env", "W", "--host", "0.0.0.0"], {"W": "a, b", "DIT_CLIENT_TOKENS": "c"})
    secrets = read_secrets(cfg.api, {"W": "a, b", "DIT_CLIENT_TOKENS": "c", "DIT_WEBHOOK_SECRET": "k"})
    assert (secrets.worker_tokens, secrets.client_tokens, secrets.webhook_secret) == ({"a", "b"}, {"c"}, b"k")
    assert "a" not in repr(secrets)


FLAG_FIELDS = [
    (["--db", "postgresql://dit@db/dit"], "database.url", "postgresql://dit@db/dit"),
    (["--host", "localhost"], "server.host", "localhost"),
    (["--port", "0"], "server.port", 0),
    (["--lease-ttl", "15"], "store.lease_ttl_s", 15.0),
    (["--max-attempts", "5"], "store.max_attempts", 5),
    (["--max-queued", "3"], "api.max_queued", 3),
    (["--max-queue-wait", "20"], "api.max_queue_wait_s", 20.0),
    (["--rate-limit", "2.5"], "api.rate_limit", 2.5),
    (["--rate-burst", "4"], "api.rate_burst", 4.0),
    (["--max-wait", "30"], "api.max_wait_s", 30.0),
    (["--db-pool", "8"], "database.pool_size", 8),
    (["--worker-liveness", "40"], "store.liveness_s", 40.0),
    (["--worker-retention", "600"], "store.retention_s", 600.0),
    (["--retention", "3600"], "store.task_retention_s", 3600.0),
    (["--remove-expired-results"], "api.remove_expired_results", True),
    (["--webhook-allow", "a.example", "--webhook-allow", "*.b.example:8443"], "api.webhook_allow",
     ("a.example", "*.b.example:8443")),
    (["--webhook-secret-env", "MY_KEY"], "api.webhook_secret_env", "MY_KEY"),
    (["--worker-tokens-env", "W"], "api.worker_tokens_env", "W"),
    (["--client-tokens-env", "C"], "api.client_tokens_env", "C"),
    (["--admit-unservable"], "api.admit_unservable", True),
    (["--results-root", "outputs", "--results-root", "/srv/r"], "api.results_roots",
     (Path("outputs").resolve(), Path("/srv/r"))),
    (["--log-level", "debug"], "logging.level", "DEBUG"),
    (["--log-format", "json"], "logging.format", "json"),
]


@pytest.mark.parametrize("argv, field, value", FLAG_FIELDS)
def test_each_flag_sets_its_field(argv, field, value):
    environ = {"DIT_WEBHOOK_SECRET": "k", "MY_KEY": "k"}
    assert field_of(load(argv, environ), field) == value
    assert field_of(load([], environ), field) != value  # the flag, not the default


def test_every_flag_of_before_is_still_there_and_tested():
    # The flags of `dit-scheduler --help` before the settings tree; launch scripts and docs use them.
    before = {"--db", "--host", "--port", "--lease-ttl", "--max-attempts", "--max-queued", "--rate-limit",
              "--rate-burst", "--max-wait", "--db-pool", "--worker-liveness", "--worker-retention", "--retention",
              "--remove-expired-results", "--webhook-allow", "--webhook-secret-env", "--worker-tokens-env",
              "--client-tokens-env", "--admit-unservable", "--results-root", "--log-level", "--log-format"}
    added = {"--max-queue-wait"}  # since
    assert {f.name for f in FLAGS} == before | added == {argv[0] for argv, _, _ in FLAG_FIELDS}
    assert not any(vars(parse_args([]))[f.name[2:].replace("-", "_")] for f in FLAGS)  # none given: the file's
