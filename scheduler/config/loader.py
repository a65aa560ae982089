"""Loading the scheduler's settings: the defaults, then a TOML file (with `extends`), then `--set`
overrides, then the command-line flags. Errors name the file and the dotted path of each field to fix
(e.g. `configs/scheduler.toml: store.lease_tll_s: unknown key`); `(command line)` stands for the
file when there is none.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from scheduler.config.schema import SchedulerConfig

COMMAND_LINE = "(command line)"


class ConfigError(Exception):
    """Settings that cannot be used; the message names the file and each field to fix."""


def load_config(path: str | Path | None = None, overrides: list[str] = (),
                flags: Mapping[str, tuple[str, object]] = {}, environ: Mapping[str, str] | None = None
                ) -> SchedulerConfig:
    """`overrides` are `section.key=value` (TOML syntax; bare words are strings); `flags` map a dotted
    field to (the flag that set it, its value). The environment (os.environ unless given) holds the
    tokens and the webhook key the checks need. A field set by both a flag and --set is refused
    rather than one silently winning."""
    source = str(path) if path is not None else COMMAND_LINE
    raw = _read(Path(path), seen=()) if path is not None else {}
    origins: dict[str, str] = {}
    try:
        for item in overrides:
            origins[_apply_override(raw, item)] = "--set"
        for key, (flag, value) in flags.items():
            if key in origins:
                raise ConfigError(f"{key}: set by both {flag} and --set; keep one")
            _put(raw, key, value)
            origins[key] = flag
        context = {"environ": os.environ if environ is None else environ}
        return SchedulerConfig.model_validate(_tuples(raw), context=context)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    except ValidationError as e:
        raise ConfigError(f"{source}: {describe_errors(e, origins)}") from None


def _read(path: Path, seen: tuple[Path, ...]) -> dict:
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
    return _merge(_read(base_path, (*seen, path.resolve())), raw)


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _apply_override(raw: dict, item: str) -> str:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text  # a bare word, e.g. database.url=postgresql://dit@db/dit
    return _put(raw, key.strip(), value)


def _put(raw: dict, key: str, value: object) -> str:
    *parents, leaf = key.split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: {part} is not a section")
    node[leaf] = value
    return key


def _tuples(value):
    # TOML and repeated flags give lists; strict mode wants tuples for the tuple fields.
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def describe_errors(e: ValidationError, origins: Mapping[str, str] = {}) -> str:
    """Pydantic's errors as `dotted.path: what is wrong (from --flag)`, joined by "; ". A rule that
    spans sections is raised at the top with the field it names at the start of its message."""
    out = []
    for err in e.errors():
        what = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        where = ".".join(str(p) for p in err["loc"])
        line = f"{where}: {what}" if where else what
        field = where or what.partition(":")[0]
        if origin := next((o for k, o in origins.items() if _within(field, k) or _within(k, field)), None):
            line += f" (from {origin})"
        out.append(line)
    return "; ".join(out)


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent + ".")
