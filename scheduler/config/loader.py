"""Loading the scheduler's settings: the defaults, then a TOML file (with `extends`), then `--set`
overrides, then the command-line flags. Errors name the file and the dotted path of each field to fix
(e.g. `configs/scheduler.toml: store.lease_tll_s: unknown key`); `(command line)` stands for the
file when there is none.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

import tomlconf
from scheduler.config.schema import SchedulerConfig
from tomlconf import ConfigError, describe_errors

COMMAND_LINE = "(command line)"


def load_config(path: str | Path | None = None, overrides: list[str] = (),
                flags: Mapping[str, tuple[str, object]] = {}, environ: Mapping[str, str] | None = None
                ) -> SchedulerConfig:
    """`overrides` are `section.key=value` (TOML syntax; bare words are strings); `flags` map a dotted
    field to (the flag that set it, its value). The environment (os.environ unless given) holds the
    tokens and the webhook key the checks need. A field set by both a flag and --set is refused
    rather than one silently winning."""
    source = str(path) if path is not None else COMMAND_LINE
    raw = tomlconf.read(Path(path)) if path is not None else {}
    origins: dict[str, str] = {}
    try:
        for item in overrides:
            origins[tomlconf.override(raw, item)] = "--set"
        for key, (flag, value) in flags.items():
            if key in origins:
                raise ConfigError(f"{key}: set by both {flag} and --set; keep one")
            tomlconf.put(raw, key, value)
            origins[key] = flag
        context = {"environ": os.environ if environ is None else environ}
        return SchedulerConfig.model_validate(tomlconf.tuples(raw), context=context)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    except ValidationError as e:
        raise ConfigError(f"{source}: {describe_errors(e, origins=origins)}") from None
