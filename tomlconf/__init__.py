"""TOML settings files as both entry points read them: a file may start from another with
`extends = "base.toml"` (relative to itself) and set only what differs; `--set section.key=value`
overrides are TOML values (bare words are strings); arrays become tuples, which pydantic's strict
tuple fields want. It depends on nothing of ours, so the worker and the scheduler share it without
meeting (pyproject.toml, [tool.importlinter]). Each validates the result against its own tree.
"""

from __future__ import annotations

import tomllib
from pathlib import Path


class ConfigError(Exception):
    """Settings that cannot be used; the message names the file and each field to fix."""


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
