"""The command-line flags of `dit-scheduler`, generated from the settings tree: one flag per field,
named after it (`store.task_retention_s` is `--store-task-retention-s`), its help the field's
description and default. A flag given overrides the file and a flag left out leaves the file's
value, so each flag's argparse default is None. The flags it had before each still set their field
for one release, with a warning naming the new flag (RENAMED_FLAGS)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args, get_origin

from pydantic import BaseModel

from scheduler.config.schema import SchedulerConfig
from tomlconf import ConfigError


@dataclass(frozen=True)
class Flag:
    name: str
    field: str  # dotted path in the tree
    help: str
    kwargs: dict  # argparse's type, action, choices, metavar


# The flags `dit-scheduler` had before they were generated, and the field each set.
RENAMED_FLAGS = {
    "--db": "database.url", "--host": "server.host", "--port": "server.port",
    "--lease-ttl": "store.lease_ttl_s", "--max-attempts": "store.max_attempts",
    "--max-queued": "api.gate.max_queued", "--max-queue-wait": "api.gate.max_queue_wait_s",
    "--rate-limit": "api.gate.rate_limit", "--rate-burst": "api.gate.rate_burst",
    "--max-wait": "api.waits.max_s", "--db-pool": "database.pool_size",
    "--worker-liveness": "store.liveness_s", "--worker-retention": "store.worker_retention_s",
    "--retention": "store.task_retention_s", "--remove-expired-results": "api.results.remove_expired",
    "--webhook-allow": "api.webhooks.allow", "--webhook-secret-env": "api.webhooks.secret_env",
    "--worker-tokens-env": "api.auth.worker_tokens_env", "--client-tokens-env": "api.auth.client_tokens_env",
    "--admit-unservable": "api.gate.admit_unservable", "--results-root": "api.results.roots",
    "--log-level": "logging.level", "--log-format": "logging.format",
}


def flag_name(field: str) -> str:
    return "--" + field.replace(".", "-").replace("_", "-")


def fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, object]]:
    """(dotted path, FieldInfo) of every setting in the tree, sections walked in order."""
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            yield from fields(info.annotation, path + ".")
        else:
            yield path, info


def _kwargs(annotation) -> dict:
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if annotation in (int, float):
        return {"type": annotation, "metavar": "N"}
    if get_origin(annotation) is Literal:  # any case, as the settings file takes it
        choices = get_args(annotation)
        return {"choices": choices, "type": lambda v: next((c for c in choices if c.lower() == v.lower()), v)}
    if get_origin(annotation) is tuple:  # repeatable: the flags' list replaces the file's
        item = get_args(annotation)[0]
        return {"action": "append", "metavar": "DIR" if item is Path else "VALUE",
                **({"type": item} if item in (int, float) else {})}
    return {"metavar": "TEXT"}


def _flags() -> tuple[Flag, ...]:
    return tuple(Flag(flag_name(path), path, (info.description or "").strip(), _kwargs(info.annotation))
                 for path, info in fields(SchedulerConfig))


FLAGS = _flags()
BY_FIELD = {f.field: f for f in FLAGS}


def field_of(tree: SchedulerConfig, path: str):
    node = tree
    for part in path.split("."):
        node = getattr(node, part)
    return node


def add_flags(parser: argparse.ArgumentParser) -> None:
    defaults = SchedulerConfig.model_validate({}, context={"environ": {}})
    for f in FLAGS:
        where = f"[default {field_of(defaults, f.field)!r}]"
        parser.add_argument(f.name, dest=f.field, default=None, help=f"{f.help} {where}".strip(), **f.kwargs)
    old = parser.add_argument_group("renamed flags (each still works for one release, with a warning)")
    for name, field in RENAMED_FLAGS.items():
        kwargs = dict(BY_FIELD[field].kwargs)
        if kwargs.get("action") is argparse.BooleanOptionalAction:
            kwargs["action"] = "store_true"  # as the old flag was: present or not
        old.add_argument(name, dest=f"renamed:{name}", default=None, help=f"now {BY_FIELD[field].name}", **kwargs)


def flag_values(args: argparse.Namespace, deprecated: Callable[[str], None] | None = None
                ) -> dict[str, tuple[str, object]]:
    """The flags given, as load_config's `flags`: dotted field -> (flag, value). A renamed flag sets
    its field as the new one does, and `deprecated` is told; both for one field are refused."""
    out = {}
    given = vars(args)
    for f in FLAGS:
        value = given.get(f.field)
        if value is not None:
            out[f.field] = (f.name, tuple(value) if isinstance(value, list) else value)
    for name, field in RENAMED_FLAGS.items():
        value = given.get(f"renamed:{name}")
        if value is None or value is False:
            continue
        if field in out:
            raise ConfigError(f"{field}: set by both {out[field][0]} and {name}; keep {out[field][0]}")
        out[field] = (name, tuple(value) if isinstance(value, list) else value)
        if deprecated:
            deprecated(f"{name} is now {BY_FIELD[field].name} (the old flag goes in the next release)")
    return out
