"""Loading check backends: the library of a built-in one, or one of your own named in config as
"module:callable" and built with keyword options."""

from __future__ import annotations

import importlib

from safety.config import CustomConfig
from safety.verdicts import SafetyLoadError


def build_custom(cfg: CustomConfig, where: str):
    module_name, _, attr = cfg.factory.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise SafetyLoadError(f"{where}.custom.factory: cannot import {cfg.factory!r}: {e}") from e
    check = factory(**cfg.options)
    if not callable(getattr(check, "check", None)):
        raise SafetyLoadError(f"{where}.custom.factory: {cfg.factory} returned no object with check()")
    return check


def import_backend(module: str, where: str):
    """The library a built-in backend runs on; SafetyLoadError naming the config field that chose it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise SafetyLoadError(f"{where}: {module} is not installed: {e}") from e
