"""`python -m scheduler` / `dit-scheduler`: run the reference scheduler."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys

from scheduler.app import create_app
from scheduler.config import ConfigError, add_flags, flag_values, load_config, read_secrets
from telemetry import logs
from scheduler.metrics import SchedulerMetrics
from scheduler.server import Server, config
from scheduler.store import open_store
from scheduler.waiting import Stop

log = logging.getLogger("scheduler")
# A setting that cannot work: restarting cannot cure it (argparse exits 2 for a bad flag, too).
EXIT_CONFIG = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dit-scheduler", description=__doc__)
    p.add_argument("--config", help="TOML file, e.g. configs/scheduler.toml; none: the defaults")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one setting (TOML syntax), e.g. --set api.waits.lease_poll_s=2")
    # The flags below each set one field of the tree, shown in brackets; they override the file.
    add_flags(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    renamed: list[str] = []  # settings and flags under their old names: said once logging is set up
    try:
        cfg = load_config(args.config, args.set, flag_values(args, renamed.append), deprecated=renamed.append)
    except ConfigError as e:
        print(f"scheduler: {e}", file=sys.stderr)  # one line naming the field; no traceback
        return EXIT_CONFIG
    logs.configure(cfg.logging.level, cfg.logging.format)
    for note in renamed:
        log.warning("deprecated: %s", note)
    secrets = read_secrets(cfg.api, os.environ)
    db, server = cfg.database, cfg.server
    models = cfg.models
    store = open_store(db.url, pool_size=db.pool_size, busy_timeout_s=db.busy_timeout_s, **dict(cfg.store),
                       models=models.ids, default_model=models.default, cold_wait_s=models.cold_wait_s,
                       route=models.route, adapter_wait_s=models.adapter_wait_s)
    log.info("scheduler on http://%s:%d, db %s, lease ttl %.0fs, max attempts %d, auth %s",
             server.host, server.port, db.url, cfg.store.lease_ttl_s, cfg.store.max_attempts,
             "on" if secrets.worker_tokens else "off (loopback)")
    metrics, stop = SchedulerMetrics(store), Stop()
    app = create_app(store, cfg.api, secrets, metrics=metrics, stop=stop)
    # What start-up made lives as long as the process. A full collection walked it all, twice or
    # more a second under 500 workers: 75-100 ms pauses of every request. Frozen, the collector
    # leaves it alone (pauses of 4-20 ms over the ~15,000 objects requests make).
    gc.collect()
    gc.freeze()
    Server(config(app, server, cfg.logging.level.lower()), server, on_stop=stop.fire,
           on_lag=metrics.loop_lag.observe).run()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
