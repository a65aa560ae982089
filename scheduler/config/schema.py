"""The scheduler's settings tree: one typed section per component, each component receiving only its
own (the store: `database` and `store`; the HTTP API: `api`). Rules that span sections, and the two
that need the environment (tokens off loopback, a key for webhooks), are checked here, so a
combination that cannot work is refused at start, naming the field.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from protocol import ModelId
from pydantic import Field, ValidationInfo, field_validator, model_validator

from tomlconf import LoggingConfig, Section


class ServerConfig(Section):
    host: str = Field("127.0.0.1", min_length=1, description="address the HTTP API listens on; off loopback, "
                      "tokens are required")
    port: int = Field(8700, ge=0, le=65535, description="0: any free port")
    # The event loop serves every request. One that has not turned for this long waits for something
    # that will not come: every thread's stack is logged and the process exits (EXIT_STUCK) for its
    # supervisor to restart it. Above the longest bounded wait on the loop (database.busy_timeout_s).
    stuck_loop_s: float = Field(30.0, ge=0, description="the event loop not turning this long: log every "
                                "thread's stack and exit for a restart; 0: never")
    # SIGTERM or SIGINT: no new connections, waiting calls answered now, the calls in flight finished,
    # the open group committed; whatever is left at this deadline is cut. A second signal: at once.
    shutdown_s: float = Field(10.0, gt=0, description="a stop signal ends the process within this")


class DatabaseConfig(Section):
    # An SQLite file (WAL mode; one scheduler process), or postgresql://user@host/db for several.
    url: str = Field("var/scheduler.db", min_length=1)
    # PostgreSQL connections per pool, two pools per process; ignored for SQLite.
    pool_size: int = Field(4, ge=1)
    # SQLite: how long a write waits for the file's lock held by another process (a backup, a second
    # scheduler by mistake) before it fails; ignored for PostgreSQL.
    busy_timeout_s: float = Field(10.0, gt=0, description="SQLite: a write waits this long for another "
                                  "process's lock")


class StoreConfig(Section):
    """How tasks are leased and how long what ended is kept. The names are open_store's keywords."""

    lease_ttl_s: float = Field(60.0, gt=0, description="a lease lives this long without renewal")
    max_attempts: int = Field(3, ge=1, description="leases per task before it fails for good")
    liveness_s: float = Field(90.0, gt=0, description="a worker silent this long is lost; its tasks go back")
    worker_retention_s: float = Field(86400.0, ge=0, description="lost, replaced and drained worker "
                                      "registrations stay listed")
    task_retention_s: float = Field(7 * 86400.0, ge=0, description="an ended task is kept (its expires_at)")


class AuthConfig(Section):
    """Bearer tokens, by the environment variables that hold them (Secrets: never in a file). None
    set: auth is off, which only a scheduler listening on loopback may be."""

    worker_tokens_env: str = Field("DIT_WORKER_TOKENS", min_length=1, description="comma-separated tokens")
    client_tokens_env: str = Field("DIT_CLIENT_TOKENS", min_length=1, description="comma-separated tokens")


class GateConfig(Section):
    """A submission's checks before it is stored (scheduler/api/gate.py, SubmitGate): the queue's
    room, the wait it implies, this process's own pace, each client's rate, and what the fleet can
    serve. Workers' calls are never refused by them."""

    max_queued: int = Field(100_000, ge=0, description="429 to clients beyond this backlog")
    # The gate weighs each submission against the queue's depth per priority, the end rate and the
    # live workers' limits as read at most this often (plus what this process admitted and leased
    # since): a count per submit grows with the backlog. 0: read on every submission.
    read_s: float = Field(1.0, ge=0, description="the queue's depth and the fleet are read at most this often")
    # Bounded by the fleet's end rate: a task that would wait longer than this (its priority's lane
    # and those above it, at the tasks ended per second lately) is refused with a Retry-After. Batch
    # submitters that accept a longer queue raise it; 0 switches it off.
    max_queue_wait_s: float = Field(300.0, ge=0, description="429 when a new task would wait longer than this "
                                    "at the fleet's end rate; 0: no such limit")
    # Bounded by what this process can take in. When it is itself saturated (its CPU, its database), a
    # submit would wait its turn for many seconds (30 s timeouts were seen) and slow the leases and
    # reports that empty the queue. So while even the fastest submit of the last 100 ms took longer
    # than this to be checked and stored (a standing queue, not a burst), only as many submits as it
    # stores in this time are let in, and the rest get a 429 at once (gate.StandingQueue). 0: never.
    max_submit_s: float = Field(0.25, ge=0, description="429 to submits while this process takes longer than "
                                "this to take one in (the fastest of the last 100 ms); 0: never")
    # Per client (bearer token, or address when auth is off).
    rate_limit: float = Field(0.0, ge=0, description="tasks per second per client; 0: no limit")
    rate_burst: float = Field(0.0, ge=0, description="0: ten seconds' worth of rate_limit")
    # Accept inputs no live worker's advertised limits allow (workers that start later, mixed models):
    # they then fail at their worker with invalid_request instead of a 422 at submission.
    admit_unservable: bool = False


class WaitsConfig(Section):
    """Long polls: a client waiting for its tasks to end, a worker's lease request waiting for work."""

    max_s: float = Field(60.0, ge=0, description="the longest `Prefer: wait=N` or `?wait_s=N` a client may ask for")
    task_poll_s: float = Field(1.0, gt=0, description="how often a client's wait looks for tasks ended by "
                               "another process")
    # Wake-ups (local, or NOTIFY from other processes) make new work visible at once; this is the
    # fallback for a missed NOTIFY.
    lease_poll_s: float = Field(5.0, gt=0, description="a waiting lease request looks again this often "
                                "without a wake-up")


class WebhooksConfig(Section):
    """Where a task's webhook may point, how deliveries are signed, how long they are retried."""

    # Hosts a task's webhook may name (host, host:port, *.domain); none: webhooks are refused.
    allow: tuple[str, ...] = ()
    secret_env: str = Field("DIT_WEBHOOK_SECRET", min_length=1, description="the variable holding the "
                            "HMAC-SHA256 key that signs deliveries")
    max_age_s: float = Field(3600.0, gt=0, description="retries of one webhook event stop this long after "
                             "the first")


class ResultsConfig(Section):
    """Local result files the scheduler may touch."""

    # Folders whose result files the status page may show as thumbnails. Resolved against the
    # working directory, as the app compares resolved paths.
    roots: tuple[Path, ...] = ()
    # Delete an expired task's local result file (only under roots).
    remove_expired: bool = False

    @field_validator("roots", mode="before")
    @classmethod
    def _resolved(cls, value):
        if isinstance(value, (list, tuple)) and all(isinstance(v, (str, Path)) for v in value):
            return tuple(Path(v).resolve() for v in value)
        return value  # strict validation names what is wrong


class ApiConfig(Section):
    """The HTTP API (scheduler.app.create_app takes this section as it is), one sub-section per
    concern. Its three secrets are not here: they come from the environment variables that
    `auth.*_env` and `webhooks.secret_env` name (Secrets)."""

    # A task's input is a prompt and a few numbers.
    max_body_bytes: int = Field(1 << 20, ge=1, description="413 beyond")
    sweep_interval_s: float = Field(1.0, gt=0, description="expired leases and silent workers are looked for "
                                    "this often")
    ready_deadline_s: float = Field(2.0, gt=0, description="/readyz: the database's answer within this")
    status_cache_s: float = Field(2.0, ge=0, description="one status page gather serves every viewer this long")
    # Submit, lease, heartbeat and report, when well formed and admitted, skip FastAPI's per-request
    # machinery (scheduler/api/hot.py): the same answers for about half the CPU per call. False sends
    # every call through FastAPI, to compare.
    hot_path: bool = True
    auth: AuthConfig = AuthConfig()
    gate: GateConfig = GateConfig()
    waits: WaitsConfig = WaitsConfig()
    webhooks: WebhooksConfig = WebhooksConfig()
    results: ResultsConfig = ResultsConfig()


# The keys the scheduler read before [api] was split by concern and store.retention_s was named for
# what it keeps: each still works for one release, with a warning naming its new place.
RENAMED_KEYS = {
    "api.worker_tokens_env": "api.auth.worker_tokens_env",
    "api.client_tokens_env": "api.auth.client_tokens_env",
    "api.max_queued": "api.gate.max_queued",
    "api.admission_read_s": "api.gate.read_s",
    "api.max_queue_wait_s": "api.gate.max_queue_wait_s",
    "api.max_submit_s": "api.gate.max_submit_s",
    "api.rate_limit": "api.gate.rate_limit",
    "api.rate_burst": "api.gate.rate_burst",
    "api.admit_unservable": "api.gate.admit_unservable",
    "api.max_wait_s": "api.waits.max_s",
    "api.wait_poll_s": "api.waits.task_poll_s",
    "api.poll_s": "api.waits.lease_poll_s",
    "api.webhook_allow": "api.webhooks.allow",
    "api.webhook_secret_env": "api.webhooks.secret_env",
    "api.webhook_max_age_s": "api.webhooks.max_age_s",
    "api.results_roots": "api.results.roots",
    "api.remove_expired_results": "api.results.remove_expired",
    "store.retention_s": "store.worker_retention_s",
}


class ModelsConfig(Section):
    """The models this fleet serves (docs/protocol.md, "Models"). No ids: one model, and tasks name
    none; any worker takes any task. Else a task names one of them (or gets `default`), and a lease
    gives a worker tasks of the models it holds or can load, routed by `route`."""

    ids: tuple[ModelId, ...] = Field((), description="the fleet's model ids, as workers name them (model.name)")
    default: str = Field("", description="the model of a task that names none; empty: the first of ids")
    # How long a task waits for a worker holding its model before one that must load it takes it;
    # also the least time between two workers taking up one model so (no herd of swaps).
    cold_wait_s: float = Field(10.0, ge=0)
    # affinity: a worker's own models first (store/routing.py); fifo: the oldest task of any model
    # it serves, held or not (the baseline make bench-models compares against).
    route: Literal["affinity", "fifo"] = "affinity"
    # How long a task whose LoRA adapters (input.loras) another live worker holds loaded is left to it
    # before any worker takes it; with or without model ids. Loading adapters takes a second or two,
    # a model tens of seconds: so much shorter than cold_wait_s.
    adapter_wait_s: float = Field(2.0, ge=0)

    @field_validator("ids")
    @classmethod
    def _ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("a model is listed twice")
        return value

    @model_validator(mode="after")
    def _default_listed(self) -> "ModelsConfig":
        if self.default and self.default not in self.ids:
            raise ValueError(f"default: {self.default!r} is not one of ids ({', '.join(self.ids) or 'none set'})")
        return self


@dataclass(frozen=True)
class Secrets:
    """What the `api.*_env` variables hold; never in a file, never in a repr."""

    worker_tokens: frozenset[str] = field(default=frozenset(), repr=False)
    client_tokens: frozenset[str] = field(default=frozenset(), repr=False)
    webhook_secret: bytes = field(default=b"", repr=False)


def read_secrets(api: ApiConfig, environ: Mapping[str, str]) -> Secrets:
    def tokens(name: str) -> frozenset[str]:
        return frozenset(t.strip() for t in environ.get(name, "").split(",") if t.strip())

    return Secrets(tokens(api.auth.worker_tokens_env), tokens(api.auth.client_tokens_env),
                   environ.get(api.webhooks.secret_env, "").encode())


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


class SchedulerConfig(Section):
    """The whole tree. A section the file leaves out takes its defaults. Validate with
    context={"environ": ...} to check against other than os.environ."""

    server: ServerConfig
    database: DatabaseConfig
    store: StoreConfig
    api: ApiConfig
    models: ModelsConfig
    logging: LoggingConfig

    @model_validator(mode="before")
    @classmethod
    def _missing_sections_are_empty(cls, data):
        if not isinstance(data, dict):
            return data
        return {**{name: {} for name in cls.model_fields}, **data}

    @model_validator(mode="after")
    def _can_work(self, info: ValidationInfo) -> "SchedulerConfig":
        api = self.api
        if 0 < self.server.stuck_loop_s <= self.database.busy_timeout_s:
            raise ValueError(f"server.stuck_loop_s: {self.server.stuck_loop_s:g}s would restart a scheduler "
                             f"waiting out a busy database (database.busy_timeout_s = "
                             f"{self.database.busy_timeout_s:g}s); above it, or 0 for never")
        if 0 < api.gate.rate_burst < 1 and api.gate.rate_limit > 0:
            raise ValueError("api.gate.rate_burst: under 1, no task could ever be submitted; "
                             "at least 1, or 0 for ten seconds' worth of api.gate.rate_limit")
        secrets = read_secrets(api, (info.context or {}).get("environ", os.environ))
        if api.webhooks.allow and not secrets.webhook_secret:
            raise ValueError(f"api.webhooks.allow: webhooks need a signing key: set {api.webhooks.secret_env} "
                             "(a long random string shared with the receivers)")
        # Empty token sets switch auth off: only where nothing but this machine can reach it.
        if not (secrets.worker_tokens and secrets.client_tokens) and not is_loopback(self.server.host):
            raise ValueError(f"server.host: refusing to listen on {self.server.host} without auth: set "
                             f"{api.auth.worker_tokens_env} and {api.auth.client_tokens_env} (comma-separated tokens)")
        return self
