"""Loading the worker's configuration from a TOML file in configs/: `extends`, `--set` overrides,
and errors that name the file and the dotted path of each field to fix (e.g.
`configs/x.toml: queue.lease_wiat_s: unknown key`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

import tomlconf
from tomlconf import ConfigError
from worker.config.schema import WorkerConfig


def load_config(path: str | Path, overrides: list[str] = ()) -> WorkerConfig:
    """Reads `path`, applies `section.key=value` overrides (values in TOML syntax; bare words are
    strings), and validates the result. A file may start from another with `extends = "other.toml"`
    (relative to itself) and set only what differs."""
    path = Path(path)
    raw = tomlconf.read(path)
    for item in overrides:
        tomlconf.override(raw, item)
    try:
        return WorkerConfig.model_validate(tomlconf.tuples(raw))
    except ValidationError as e:
        raise ConfigError(f"{path}: {describe_errors(e, {'extra_forbidden': 'unknown key'})}") from e


def describe_errors(e: ValidationError, words: Mapping[str, str], root: str = "(top level)") -> str:
    """Pydantic's errors as `dotted.path: what is wrong`, joined by "; ". `words` replaces the
    message of an error type (e.g. extra_forbidden -> "unknown key"); `root` names an empty path."""
    out = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"]) or root
        out.append(f"{where}: {words.get(err['type']) or err['msg'].removeprefix('Value error, ')}")
    return "; ".join(out)
