"""The settings toolkit both entry points share. TOML files as they read them: a file may start from
another with `extends = "base.toml"` (relative to itself) and set only what differs; `--set
section.key=value` overrides are TOML values (bare words are strings); arrays become tuples, which
pydantic's strict tuple fields want. The base of every section (Section), the one logging section,
and the one error formatter (describe_errors: pydantic's errors as dotted paths naming each field,
which the worker's task validation uses too). It depends on nothing of ours, so the worker and the
scheduler share it without meeting (pyproject.toml, [tool.importlinter]). Each validates the result
against its own tree.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class ConfigError(Exception):
    """Settings that cannot be used; the message names the file and each field to fix."""


class Section(BaseModel):
    """A settings section: unknown keys and loose types are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class LoggingConfig(Section):
    """How the program logs; the same section in the worker and the scheduler."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field("INFO", description="the least "
                                                                            "severe level logged (any case)")
    # One JSON object per line (for log shippers), or readable text; auto: text on a terminal.
    format: Literal["auto", "json", "text"] = "auto"

    @field_validator("level", mode="before")
    @classmethod
    def _any_case(cls, value):
        return value.upper() if isinstance(value, str) else value  # --log-level debug


UNKNOWN_KEY = {"extra_forbidden": "unknown key"}


def describe_errors(e: ValidationError, words: Mapping[str, str] = UNKNOWN_KEY, origins: Mapping[str, str] = {},
                    root: str = "") -> str:
    """Pydantic's errors as `dotted.path: what is wrong (from --flag)`, joined by "; ". `words`
    replaces the message of an error type (by default extra_forbidden: "unknown key"); `origins` maps
    a dotted field to the flag that set it; `root` names an empty path. Without `root`, a rule that
    spans sections, raised at the top, is its message alone, which starts with the field it names."""
    out = []
    for err in e.errors():
        what = words.get(err["type"]) or err["msg"].removeprefix("Value error, ")
        where = ".".join(str(p) for p in err["loc"]) or root
        line = f"{where}: {what}" if where else what
        field = where or what.partition(":")[0]
        if origin := next((o for k, o in origins.items() if _within(field, k) or _within(k, field)), None):
            line += f" (from {origin})"
        out.append(line)
    return "; ".join(out)


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent + ".")


def read(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The file's table, merged over the file it extends (and so on); a loop is refused."""
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    base = raw.pop("extends", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError(f"{path}: extends: expected a file name")
    base_path = (path.parent / base).resolve()
    if base_path in seen:
        raise ConfigError(f"{path}: extends: {base} extends itself")
    return _merge(read(base_path, (*seen, path.resolve())), raw)


def override(raw: dict, item: str) -> str:
    """Applies one `section.key=value` to `raw`; returns the dotted key it set."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text  # a bare word, e.g. queue.url=http://host:8700
    return put(raw, key.strip(), value)


def put(raw: dict, key: str, value: object) -> str:
    """Sets the dotted `key` in `raw`, making the sections on the way; returns `key`."""
    *parents, leaf = key.split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: {part} is not a section")
    node[leaf] = value
    return key


def tuples(value):
    """Lists (TOML arrays, repeated flags) as tuples, all the way down."""
    if isinstance(value, dict):
        return {k: tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(tuples(v) for v in value)
    return value


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
