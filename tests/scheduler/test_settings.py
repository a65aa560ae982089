"""The scheduler's settings tree: its defaults are the flags' old defaults, the shipped file equals
them, a file, --set and the flags stack in that order, every field has a flag named after it, and
every flag and key the scheduler had before still sets its field for a release, saying so. The app
takes the api section as it is, and the secrets it names."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import pytest

from launch.local import REPO
from scheduler.__main__ import parse_args
from scheduler.app import create_app
from scheduler.config import (FLAGS, RENAMED_FLAGS, RENAMED_KEYS, ApiConfig, ConfigError, Secrets, SchedulerConfig,
                              flag_values, load_config, read_secrets)
from scheduler.config.flags import BY_FIELD, field_of, fields, flag_name
from scheduler.store import open_store

SHIPPED = REPO / "configs" / "scheduler.toml"
SECRETS = {"worker_tokens", "client_tokens", "webhook_secret"}


def load(argv: list[str], environ: dict[str, str] | None = None, notes: list[str] | None = None) -> SchedulerConfig:
    """What `python -m scheduler ARGV` would run with; what it would warn of goes to `notes`."""
    args = parse_args(argv)
    said = [] if notes is None else notes
    return load_config(args.config, args.set, flag_values(args, said.append), deprecated=said.append,
                       environ={} if environ is None else environ)


def test_defaults_are_the_old_flag_defaults():
    cfg = load([])
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8700)
    assert (cfg.database.url, cfg.database.pool_size) == ("var/scheduler.db", 4)
    assert dict(cfg.store) == {"lease_ttl_s": 60.0, "max_attempts": 3, "liveness_s": 90.0,
                               "worker_retention_s": 86400.0, "task_retention_s": 7 * 86400.0}
    assert (cfg.api.auth.worker_tokens_env, cfg.api.auth.client_tokens_env, cfg.api.webhooks.secret_env) == (
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
    assert not SECRETS & {path.rsplit(".", 1)[-1] for path, _ in fields(ApiConfig)}


def test_the_store_section_is_open_stores_keywords(tmp_path):
    cfg = load(["--set", "store.lease_ttl_s=5", "--database-url", str(tmp_path / "s.db")])
    store = open_store(cfg.database.url, pool_size=cfg.database.pool_size, **dict(cfg.store))
    store.close()


def keys(table: dict, prefix: str = "") -> set[str]:
    return {k for name, v in table.items()
            for k in (keys(v, f"{prefix}{name}.") if isinstance(v, dict) else {f"{prefix}{name}"})}


def test_the_shipped_file_is_the_defaults_and_names_every_field():
    assert load(["--config", str(SHIPPED)]) == load([])
    assert keys(tomllib.loads(SHIPPED.read_text())) == {path for path, _ in fields(SchedulerConfig)}


def test_api_is_split_by_concern():
    assert {name for name, f in ApiConfig.model_fields.items() if hasattr(f.annotation, "model_fields")} == {
        "auth", "gate", "waits", "webhooks", "results"}
    assert len([n for n, f in ApiConfig.model_fields.items() if not hasattr(f.annotation, "model_fields")]) <= 5


def test_file_then_set_then_flags(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text('[server]\nport = 9000\nhost = "localhost"\n[api.gate]\nmax_queued = 5\n'
                    '[api.webhooks]\nallow = ["a.example"]\n')
    top = tmp_path / "top.toml"
    top.write_text('extends = "base.toml"\n[api.gate]\nmax_queued = 7\n[logging]\nlevel = "debug"\n')
    cfg = load(["--config", str(top), "--set", "api.waits.lease_poll_s=2", "--set", "database.url=postgresql://dit@db/dit",
                "--server-port", "9100", "--api-webhooks-allow", "b.example"], {"DIT_WEBHOOK_SECRET": "k"})
    assert (cfg.server.host, cfg.server.port) == ("localhost", 9100)  # the file, then the flag
    assert (cfg.api.gate.max_queued, cfg.api.waits.lease_poll_s, cfg.logging.level) == (7, 2.0, "DEBUG")
    assert cfg.database.url == "postgresql://dit@db/dit"
    assert cfg.api.webhooks.allow == ("b.example",)  # a repeatable flag replaces the file's list
    assert cfg.store == load([]).store  # what nobody set keeps its default


def test_secrets_come_from_the_variables_the_api_section_names():
    cfg = load(["--api-auth-worker-tokens-env", "W", "--server-host", "0.0.0.0"], {"W": "a, b", "DIT_CLIENT_TOKENS": "c"})
    secrets = read_secrets(cfg.api, {"W": "a, b", "DIT_CLIENT_TOKENS": "c", "DIT_WEBHOOK_SECRET": "k"})
    assert (secrets.worker_tokens, secrets.client_tokens, secrets.webhook_secret) == ({"a", "b"}, {"c"}, b"k")
    assert "a" not in repr(secrets)


def test_every_field_has_one_flag_named_after_it_and_none_given_leaves_the_file():
    paths = [path for path, _ in fields(SchedulerConfig)]
    assert [f.field for f in FLAGS] == paths and [f.name for f in FLAGS] == [flag_name(p) for p in paths]
    assert flag_name("store.task_retention_s") == "--store-task-retention-s"
    assert flag_values(parse_args([])) == {}


# One flag of each kind the tree has: text, whole number, number, switch (both ways), a choice, a list.
FLAG_FIELDS = [
    (["--database-url", "postgresql://dit@db/dit"], "database.url", "postgresql://dit@db/dit"),
    (["--server-port", "0"], "server.port", 0),
    (["--store-task-retention-s", "3600"], "store.task_retention_s", 3600.0),
    (["--api-results-remove-expired"], "api.results.remove_expired", True),
    (["--no-api-hot-path"], "api.hot_path", False),
    (["--models-route", "fifo"], "models.route", "fifo"),
    (["--logging-level", "debug"], "logging.level", "DEBUG"),
    (["--api-webhooks-allow", "a.example", "--api-webhooks-allow", "*.b.example:8443"], "api.webhooks.allow",
     ("a.example", "*.b.example:8443")),
    (["--api-results-roots", "outputs", "--api-results-roots", "/srv/r"], "api.results.roots",
     (Path("outputs").resolve(), Path("/srv/r"))),
]


@pytest.mark.parametrize("argv, field, value", FLAG_FIELDS)
def test_each_kind_of_flag_sets_its_field(argv, field, value):
    environ = {"DIT_WEBHOOK_SECRET": "k"}
    assert field_of(load(argv, environ), field) == value
    assert field_of(load([], environ), field) != value  # the flag, not the default


# Every flag of before, with a value of its kind: it sets the field it always set, and says its new name.
OLD_FLAG_VALUES = {"--db": "postgresql://dit@db/dit", "--host": "localhost", "--port": "0", "--log-level": "debug",
                   "--log-format": "json", "--webhook-secret-env": "MY_KEY", "--worker-tokens-env": "W",
                   "--client-tokens-env": "C", "--webhook-allow": "a.example", "--results-root": "/srv/r"}


@pytest.mark.parametrize("old", sorted(RENAMED_FLAGS))
def test_every_flag_of_before_still_sets_its_field_and_says_its_new_name(old):
    field = RENAMED_FLAGS[old]
    kind = BY_FIELD[field].kwargs
    argv = [old] if kind.get("action") is not None and kind["action"] != "append" else [
        old, OLD_FLAG_VALUES.get(old, "3")]
    notes: list[str] = []
    environ = {"DIT_WEBHOOK_SECRET": "k", "MY_KEY": "k"}
    new = load([BY_FIELD[field].name, *argv[1:]], environ)
    assert field_of(load(argv, environ, notes), field) == field_of(new, field)
    assert notes == [f"{old} is now {BY_FIELD[field].name} (the old flag goes in the next release)"]


def test_the_old_and_the_new_flag_for_one_field_are_refused():
    with pytest.raises(ConfigError, match=r"^server.port: set by both --server-port and --port; keep --server-port$"):
        load(["--server-port", "1", "--port", "2"])


@pytest.mark.parametrize("old", sorted(RENAMED_KEYS))
def test_every_key_of_before_still_sets_its_field_and_says_its_new_name(tmp_path, old):
    new = RENAMED_KEYS[old]
    value = {"bool": "true", "tuple": '["x.example"]' if "webhook" in old else '["/srv/r"]', "str": '"MINE"'}.get(
        type(field_of(load([]), new)).__name__, "3")
    section, key = old.split(".")
    (tmp_path / "s.toml").write_text(f"[{section}]\n{key} = {value}\n")
    notes: list[str] = []
    cfg = load(["--config", str(tmp_path / "s.toml")], {"DIT_WEBHOOK_SECRET": "k"}, notes)
    assert field_of(cfg, new) == field_of(load(["--set", f"{new}={value}"], {"DIT_WEBHOOK_SECRET": "k"}), new)
    assert field_of(cfg, new) != field_of(load([]), new)
    assert notes == [f"{tmp_path / 's.toml'}: {old} is now {new} (the old name goes in the next release)"]


def test_where_a_key_is_set_under_both_names_the_new_one_wins_and_the_old_is_said_to_be_ignored(tmp_path):
    (tmp_path / "s.toml").write_text("[api]\nmax_queued = 3\n[api.gate]\nmax_queued = 4\n")
    notes: list[str] = []
    assert load(["--config", str(tmp_path / "s.toml")], notes=notes).api.gate.max_queued == 4
    assert notes == [f"{tmp_path / 's.toml'}: api.max_queued is ignored: api.gate.max_queued, its new name, is set "
                     "too (the old name goes in the next release)"]
