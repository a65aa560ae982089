"""`dit-worker check`: the start errors no restart can cure, found before torchrun starts a group.

launch/node.sh runs it first, so a typo'd key, a wrong type, a device the machine lacks or a port
already taken ends the node at once with exit code 2 and one message, instead of a group that
torchrun restarts for ever. The ranks check the same things again (and more); this only makes the
common cases fast and quiet.
"""

from __future__ import annotations

import socket
import sys

from worker.config import ConfigError, load_config
from worker.config.schema import OpsConfig

EXIT_PERMANENT = 2  # launch/systemd/dit-worker.service: RestartPreventExitStatus


def check(config_path: str, overrides: list[str] = ()) -> int:
    try:
        cfg = load_config(config_path, overrides)
        _device(cfg.model.device, cfg.model.dtype)
        if cfg.ops.enabled:
            _port_free(cfg.ops)
    except ConfigError as e:
        print(f"not starting: {e}", file=sys.stderr)
        return EXIT_PERMANENT
    return 0


def _device(pref: str, dtype: str) -> None:
    from worker.ranks.distributed import pick_device  # imports torch: only once the config is sound

    pick_device(pref, 0, dtype)


def _port_free(cfg: OpsConfig) -> None:
    if cfg.port == 0:
        return
    family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the ops server binds it
        try:
            s.bind((cfg.host, cfg.port))
        except OSError as e:
            raise ConfigError(f"ops.port: cannot listen on {cfg.host}:{cfg.port}: {e}") from None
