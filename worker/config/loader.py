"""Loading the worker's configuration from a TOML file in configs/: `extends`, `--set` overrides,
and errors that name the file and the dotted path of each field to fix (e.g.
`configs/x.toml: queue.lease_wiat_s: unknown key`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from worker.config.schema import WorkerConfig


class ConfigError(Exception):
    """A config file that cannot be used; the message names the file and each field to fix."""


def load_config(path: str | Path, overrides: list[str] = ()) -> WorkerConfig:
    """Reads `path`, applies `section.key=value` overrides (values in TOML syntax; bare words are
    strings), and validates the result. A file may start from another with `extends = "other.toml"`
    (relative to itself) and set only what differs."""
    path = Path(path)
    raw = _read(path, seen=())
    for item in overrides:
        _apply_override(raw, item)
    try:
        return WorkerConfig.model_validate(_tuples(raw))
    except ValidationError as e:
        raise ConfigError(f"{path}: {describe_errors(e, {'extra_forbidden': 'unknown key'})}") from e


def _read(path: Path, seen: tuple[Path, ...]) -> dict:
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    base = raw.pop("extends", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError(f"{path}: extends: expected a file name")
    base_path = (path.parent / base).resolve()
    if base_path in seen:
        raise ConfigError(f"{path}: extends: {base} extends itself")
    return _merge(_read(base_path, (*seen, path.resolve())), raw)


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _apply_override(raw: dict, item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text  # a bare word, e.g. queue.url=http://host:8700
    *parents, leaf = key.strip().split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part} is not a section")
    node[leaf] = value


def _tuples(value):
    # TOML has arrays only; strict mode wants tuples for the fixed-shape fields.
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def describe_errors(e: ValidationError, words: Mapping[str, str], root: str = "(top level)") -> str:
    """Pydantic's errors as `dotted.path: what is wrong`, joined by "; ". `words` replaces the
    message of an error type (e.g. extra_forbidden -> "unknown key"); `root` names an empty path."""
    out = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"]) or root
        out.append(f"{where}: {words.get(err['type']) or err['msg'].removeprefix('Value error, ')}")
    return "; ".join(out)
