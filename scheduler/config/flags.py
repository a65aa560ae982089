"""The command-line flags `dit-scheduler` has always had, each setting one field of the tree. Their
defaults are the tree's (shown in --help); a flag given overrides the file and a flag left out leaves
the file's value, so each flag's argparse default is None."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import get_args

from scheduler.config.schema import LoggingConfig, SchedulerConfig


@dataclass(frozen=True)
class Flag:
    name: str
    field: str  # dotted path in the tree
    help: str = ""
    type: type | None = None
    action: str | None = None  # store_true, or append (repeatable: the flags' list replaces the file's)
    metavar: str | None = None
    choices: tuple[str, ...] | None = None


FLAGS = (
    Flag("--db", "database.url", "an SQLite file (WAL mode), or postgresql://user@host/db for several "
         "scheduler processes"),
    Flag("--host", "server.host"),
    Flag("--port", "server.port", type=int),
    Flag("--lease-ttl", "store.lease_ttl_s", "seconds a lease lives without renewal", float),
    Flag("--max-attempts", "store.max_attempts", "leases per task before it fails for good", int),
    Flag("--max-queued", "api.max_queued", "429 to clients beyond this backlog", int),
    Flag("--max-queue-wait", "api.max_queue_wait_s", "429 when a new task would wait longer than this many "
         "seconds at the fleet's end rate (0: off)", float),
    Flag("--rate-limit", "api.rate_limit", "tasks per second each client may submit (by bearer token, or "
         "address); 0: no limit", float),
    Flag("--rate-burst", "api.rate_burst", "tasks a client may submit at once; 0: ten seconds' worth of "
         "--rate-limit", float),
    Flag("--max-wait", "api.max_wait_s", "seconds a client may wait for a task to end in one call "
         "(Prefer: wait=N, ?wait_s=N)", float),
    Flag("--db-pool", "database.pool_size", "PostgreSQL connections per pool (two pools per process); "
         "ignored for SQLite", int),
    Flag("--worker-liveness", "store.liveness_s", "seconds without a heartbeat before a worker is lost and "
         "its tasks requeued", float),
    Flag("--worker-retention", "store.retention_s", "seconds lost and replaced registrations stay listed", float),
    Flag("--retention", "store.task_retention_s", "seconds an ended task is kept (its expires_at), then "
         "removed (604800: 7 days)", float),
    Flag("--remove-expired-results", "api.remove_expired_results", "also delete an expired task's local "
         "result file when it lies under a --results-root", action="store_true"),
    Flag("--webhook-allow", "api.webhook_allow", "a host tasks' webhooks may name (repeatable; "
         "*.example.com for a domain); none: no webhooks", action="append", metavar="HOST[:PORT]"),
    Flag("--webhook-secret-env", "api.webhook_secret_env", "env var holding the key that signs webhooks "
         "(HMAC-SHA256); needed with --webhook-allow"),
    Flag("--worker-tokens-env", "api.worker_tokens_env", "env var with comma-separated bearer tokens for workers"),
    Flag("--client-tokens-env", "api.client_tokens_env", "env var with comma-separated bearer tokens for clients"),
    Flag("--admit-unservable", "api.admit_unservable", "accept inputs no live worker's limits allow (workers "
         "that start later, or mixed models); they fail at the worker instead of a 422 at submission",
         action="store_true"),
    Flag("--results-root", "api.results_roots", "a folder of local results the status page may show as "
         "thumbnails (repeatable)", action="append", metavar="DIR"),
    Flag("--log-level", "logging.level", "DEBUG, INFO, WARNING, ERROR or CRITICAL (any case)"),
    Flag("--log-format", "logging.format", "one JSON object per line, or text; auto: text on a terminal, "
         "JSON otherwise", choices=get_args(LoggingConfig.model_fields["format"].annotation)),
)


def field_of(tree: SchedulerConfig, path: str):
    node = tree
    for part in path.split("."):
        node = getattr(node, part)
    return node


def add_flags(parser: argparse.ArgumentParser) -> None:
    defaults = SchedulerConfig.model_validate({}, context={"environ": {}})
    for f in FLAGS:
        extra = {k: v for k, v in (("type", f.type), ("action", f.action), ("metavar", f.metavar),
                                   ("choices", f.choices)) if v is not None}
        where = f"[{f.field}; default {field_of(defaults, f.field)!r}]"
        parser.add_argument(f.name, default=None, help=f"{f.help} {where}".strip(), **extra)


def flag_values(args: argparse.Namespace) -> dict[str, tuple[str, object]]:
    """The flags given, as load_config's `flags`: dotted field -> (flag, value)."""
    out = {}
    for f in FLAGS:
        value = getattr(args, f.name.removeprefix("--").replace("-", "_"))
        if value is not None:
            out[f.field] = (f.name, tuple(value) if isinstance(value, list) else value)
    return out
