"""Loading the scheduler's settings: the defaults, then a TOML file (with `extends`), then `--set`
overrides, then the command-line flags. Errors name the file and the dotted path of each field to fix
(e.g. `configs/scheduler.toml: store.lease_tll_s: unknown key`); `(command line)` stands for the
file when there is none.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from pydantic import ValidationError

import tomlconf
from scheduler.config.schema import RENAMED_KEYS, SchedulerConfig
from tomlconf import ConfigError, describe_errors

COMMAND_LINE = "(command line)"
log = logging.getLogger(__name__)


def load_config(path: str | Path | None = None, overrides: list[str] = (),
                flags: Mapping[str, tuple[str, object]] = {}, environ: Mapping[str, str] | None = None,
                deprecated: Callable[[str], None] | None = None) -> SchedulerConfig:
    """`overrides` are `section.key=value` (TOML syntax; bare words are strings); `flags` map a dotted
    field to (the flag that set it, its value). The environment (os.environ unless given) holds the
    tokens and the webhook key the checks need. A field set by both a flag and --set is refused
    rather than one silently winning. A key under its old name (RENAMED_KEYS) is read under its new
    one, and `deprecated` (a warning logged, unless given) is told so."""
    source = str(path) if path is not None else COMMAND_LINE
    raw = tomlconf.read(Path(path)) if path is not None else {}
    origins: dict[str, str] = {}
    try:
        for item in overrides:
            origins[tomlconf.override(raw, item)] = "--set"
        for note in renamed(raw, origins):
            (deprecated or log.warning)(f"{source}: {note}")
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


def renamed(raw: dict, origins: dict[str, str]) -> list[str]:
    """Moves each key set under its old name to its new one (the new name wins where both are set);
    one note per key moved, saying where it lives now."""
    notes = []
    for old, new in RENAMED_KEYS.items():
        *parents, leaf = old.split(".")
        node = raw
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        value = node.pop(leaf)
        if _has(raw, new):
            notes.append(f"{old} is ignored: {new}, its new name, is set too (the old name goes in the next release)")
            continue
        tomlconf.put(raw, new, value)
        if old in origins:
            origins[new] = origins.pop(old)
        notes.append(f"{old} is now {new} (the old name goes in the next release)")
    return notes


def _has(raw: dict, key: str) -> bool:
    node = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True
