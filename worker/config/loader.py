"""Loading the worker's configuration from a TOML file in configs/: `extends`, `--set` overrides,
and errors that name the file and the dotted path of each field to fix (e.g.
`configs/x.toml: queue.lease_wiat_s: unknown key`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

import tomlconf
from tomlconf import ConfigError, describe_errors
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
        raise ConfigError(f"{path}: {describe_errors(e, root='(top level)')}") from e
