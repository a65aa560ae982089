"""`python -m scheduler` / `dit-scheduler`: run the reference scheduler."""

from __future__ import annotations

import argparse
import gc
import ipaddress
import logging
import os
import socket
import sys
from pathlib import Path

from importlib.metadata import entry_points

import uvicorn

from scheduler.app import Settings, create_app
from telemetry import logs
from scheduler.store import open_store

log = logging.getLogger("scheduler")


def _tokens(env_name: str) -> frozenset[str]:
    return frozenset(t.strip() for t in os.environ.get(env_name, "").split(",") if t.strip())


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _at_least_one(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 1")
    return int(value)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dit-scheduler", description=__doc__)
    p.add_argument("--db", default="var/scheduler.db",
                   help="an SQLite file (WAL mode), or postgresql://user@host/db for several scheduler processes")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8700)
    p.add_argument("--lease-ttl", type=float, default=60.0, help="seconds a lease lives without renewal")
    p.add_argument("--max-attempts", type=int, default=3, help="leases per task before it fails for good")
    p.add_argument("--max-queued", type=int, default=100_000, help="429 to clients beyond this backlog")
    p.add_argument("--rate-limit", type=float, default=0.0,
                   help="tasks per second each client may submit (by bearer token, or address); 0: no limit")
    p.add_argument("--rate-burst", type=float, default=0.0, help="tasks a client may submit at once; 0: ten "
                   "seconds' worth of --rate-limit")
    p.add_argument("--max-wait", type=float, default=60.0,
                   help="seconds a client may wait for a task to end in one call (Prefer: wait=N, ?wait_s=N)")
    p.add_argument("--db-pool", type=_at_least_one, default=4,
                   help="PostgreSQL connections per pool (two pools per process); ignored for SQLite")
    p.add_argument("--worker-liveness", type=float, default=90.0,
                   help="seconds without a heartbeat before a worker is lost and its tasks requeued")
    p.add_argument("--worker-retention", type=float, default=86400.0,
                   help="seconds lost and replaced registrations stay listed")
    p.add_argument("--retention", type=float, default=7 * 86400.0,
                   help="seconds an ended task is kept (its expires_at), then removed; default 7 days")
    p.add_argument("--remove-expired-results", action="store_true",
                   help="also delete an expired task's local result file when it lies under a --results-root")
    p.add_argument("--webhook-allow", action="append", default=[], metavar="HOST[:PORT]",
                   help="a host tasks' webhooks may name (repeatable; *.example.com for a domain); none: no webhooks")
    p.add_argument("--webhook-secret-env", default="DIT_WEBHOOK_SECRET",
                   help="env var holding the key that signs webhooks (HMAC-SHA256); needed with --webhook-allow")
    p.add_argument("--worker-tokens-env", default="DIT_WORKER_TOKENS",
                   help="env var with comma-separated bearer tokens for workers")
    p.add_argument("--client-tokens-env", default="DIT_CLIENT_TOKENS",
                   help="env var with comma-separated bearer tokens for clients")
    p.add_argument("--admit-unservable", action="store_true",
                   help="accept inputs no live worker's limits allow (workers that start later, or mixed models); "
                   "they fail at the worker instead of a 422 at submission")
    p.add_argument("--results-root", action="append", default=[], metavar="DIR",
                   help="a folder of local results the status page may show as thumbnails (repeatable)")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-format", choices=("auto", "json", "text"), default="auto",
                   help="one JSON object per line, or text; auto: text on a terminal, JSON otherwise")
    return p.parse_args(argv)


PLUGINS = "dit_scheduler.commands"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Tools add commands (this repository's: `bench`) as entry points; the scheduler never imports them.
    plugins = {ep.name: ep for ep in entry_points(group=PLUGINS)}
    if argv and argv[0] in plugins:
        return plugins[argv[0]].load()(argv[1:])
    args = parse_args(argv)
    logs.configure(args.log_level.upper(), args.log_format)
    settings = Settings(worker_tokens=_tokens(args.worker_tokens_env),
                        client_tokens=_tokens(args.client_tokens_env), max_queued=args.max_queued,
                        results_roots=tuple(Path(r).resolve() for r in args.results_root),
                        max_wait_s=args.max_wait, rate_limit=args.rate_limit, rate_burst=args.rate_burst,
                        remove_expired_results=args.remove_expired_results,
                        admit_unservable=args.admit_unservable,
                        webhook_allow=tuple(args.webhook_allow),
                        webhook_secret=os.environ.get(args.webhook_secret_env, "").encode())
    if args.webhook_allow and not settings.webhook_secret:
        log.error("--webhook-allow needs a signing key: set %s (a long random string shared with the receivers)",
                  args.webhook_secret_env)
        return 2
    if not _is_loopback(args.host) and not (settings.worker_tokens and settings.client_tokens):
        log.error("refusing to listen on %s without auth: set %s and %s (comma-separated tokens)",
                  args.host, args.worker_tokens_env, args.client_tokens_env)
        return 2
    store = open_store(args.db, lease_ttl_s=args.lease_ttl, max_attempts=args.max_attempts,
                       liveness_s=args.worker_liveness, retention_s=args.worker_retention, pool_size=args.db_pool,
                       task_retention_s=args.retention)
    log.info("scheduler on http://%s:%d, db %s, lease ttl %.0fs, max attempts %d, auth %s",
             args.host, args.port, args.db, args.lease_ttl, args.max_attempts,
             "on" if settings.worker_tokens else "off (loopback)")
    app = create_app(store, settings)
    # What start-up made lives as long as the process. A full collection walked it all, twice or
    # more a second under 500 workers: 75-100 ms pauses of every request. Frozen, the collector
    # leaves it alone (pauses of 4-20 ms over the ~15,000 objects requests make).
    gc.collect()
    gc.freeze()
    # log_config=None: uvicorn's lines go through the one handler configured above.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower(), access_log=False,
                log_config=None)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
