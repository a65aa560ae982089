"""Wire models of the queue protocol (docs/protocol.md).

This package is the protocol's single definition: the reference scheduler serves it and the worker
speaks it. It imports only pydantic so that other schedulers can reuse it as a schema.

The scheduler stores a task's `input` as the client sent it. Each worker validates it against its own
limits (sizes, steps, prompt length depend on the model it serves) and fails a bad task with a reason.
Workers also advertise those limits when they register (WorkerLimits), so the reference scheduler
refuses at submission an input that no live worker could serve; with no live worker registered it
cannot know, and accepts. Types and unknown fields are left to the worker.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator,
                      model_serializer, model_validator)

TaskStatus = Literal["queued", "leased", "processing", "succeeded", "failed", "cancelled"]
FINAL_STATUSES = ("succeeded", "failed", "cancelled")  # a task in one never changes again


class RegistrationStatus(StrEnum):
    """A worker registration's status. Which may follow which is the scheduler's table
    (scheduler.store.lifecycle.REGISTRATION_TRANSITIONS, drawn in docs/architecture.md)."""

    INITIALIZING = "initializing"  # registered, loading and warming up
    READY = "ready"  # serving
    DRAINING = "draining"  # takes no new work, finishing what it holds
    # Its last heartbeat, sent when a drain has finished every task it held and it is leaving; the
    # registration is closed for good.
    DRAINED = "drained"
    # A later registration from the same node (a restarted torchrun group) took its place.
    REPLACED = "replaced"
    LOST = "lost"  # no heartbeat for the scheduler's liveness time; what it held was requeued


# What a worker reports of itself in a heartbeat: replaced and lost are the scheduler's to say. The
# values as plain strings, so that a peer's 422 lists them as it would send them.
WorkerStatus = Literal[tuple(s.value for s in (RegistrationStatus.INITIALIZING, RegistrationStatus.READY,
                                               RegistrationStatus.DRAINING, RegistrationStatus.DRAINED))]
# released: leased but never started, handed back (the attempt does not count).
ReportStatus = Literal["processing", "succeeded", "failed", "released"]


# Bounds on every list and string a peer sends, so a hostile or broken peer gets a 422, not a
# scheduler that stores and serves megabytes (the HTTP body itself is capped too).
MAX_DEVICES = 4096  # ranks of one worker group
MAX_IN_FLIGHT = 4096
Id = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:\-]+$")]
Text = Annotated[str, StringConstraints(max_length=2000)]


def _valid_unicode(data: Any) -> Any:
    """Refuses lone surrogates (JSON's "\ud800" escapes decode to them): no UTF-8 encoding, so no
    database or JSON answer could hold them."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("text must be valid Unicode (a lone surrogate was sent)") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return data


# The validation context of data whose text was seen to hold no lone surrogate (parse_body): the
# models in it skip the walk each of them would make over its part (a nested model's strings walked
# again at each level: a tenth of an exchange's CPU).
_UNICODE_SEEN = "unicode_seen"
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
Model = TypeVar("Model", bound=BaseModel)


def stored(model: type[Model], data: dict[str, Any]) -> Model:
    """`model` from what the scheduler reads back from its store, validated as any other but for
    the lone-surrogate walk (a third of a task view's cost): that text was checked as it came in
    (parse_body, the models' own check), and the store holds what it was given."""
    return model.model_validate(data, context={_UNICODE_SEEN: True})


def parse_body(model: type[Model], body: bytes) -> Model:
    """`model` from a JSON request body, as model_validate(json.loads(body)) makes it (the same
    model or the same error), for less: a body that is strict UTF-8 (so no encoded surrogate) and
    escapes no surrogate ("\\ud800") cannot hold a lone one, so its models need not look."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:  # another encoding json.loads reads, or surrogates encoded
        return model.model_validate(json.loads(body))
    if text.startswith("\ufeff"):  # json.loads(bytes) reads past a byte order mark
        text = text[1:]
    seen = "\\u" not in text or _SURROGATE_ESCAPE.search(text) is None
    return model.model_validate(json.loads(text), context={_UNICODE_SEEN: True} if seen else None)


# Bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069). One left open
# reorders whatever is shown after it (a caption flips, a log line reads backwards), so prompts may not
# carry them. The marks U+200E, U+200F and U+061C are allowed: they only set the direction of the
# neutral characters next to them, open no scope, and right-to-left prompts legitimately use them.
BIDI_CONTROLS = frozenset(chr(c) for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)])


def bidi_control(text: str) -> str | None:
    """The first bidirectional control character in `text`, as "U+202E (RIGHT-TO-LEFT OVERRIDE)"."""
    for ch in text:
        if ch in BIDI_CONTROLS:
            return f"U+{ord(ch):04X} ({unicodedata.name(ch)})"
    return None


class _Wire(BaseModel):
    """What every wire model refuses: NaN and infinity (not JSON; a 422 echoing them could not be
    sent) and lone surrogates."""

    model_config = ConfigDict(allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(info.context, dict) and info.context.get(_UNICODE_SEEN):
            return data
        return _valid_unicode(data)


class _Strict(_Wire):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# ---------------------------------------------------------------- clients


class Webhook(_Strict):
    """A URL the scheduler calls (POST, JSON of the task, signed) when the task ends, and when it
    starts if asked. Only hosts the operator allows are accepted."""

    url: str = Field(max_length=2000, pattern=r"^https?://[^\s/]+", description="http(s) URL on an allowed host")
    events: list[Literal["started", "ended"]] = Field(["ended"], min_length=1, max_length=2)


class WebhookAttempt(_Strict):
    event: Literal["started", "ended"]
    at: float
    status_code: int | None = None
    error: str | None = None
    delivered: bool


ModelId = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:\-]+$")]
MAX_MODELS = 64  # models one worker may hold or load
# A task's set of LoRA adapters as the scheduler routes by it (adapter_set_key); "" is none.
AdapterSetKey = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
MAX_ADAPTER_SETS = 64  # sets one worker may say it holds


def adapter_set_key(loras: Any) -> str:
    """The name of a task's set of adapters (its `input.loras`), for routing: "" for none; else 16
    hex digits of the SHA-256 of its distinct sources, sorted, one per line (scales do not count: a
    worker that holds a set switches scales for free). The scheduler stores it with the task and
    a worker names the sets it holds by it, each from the task's input as submitted."""
    if not isinstance(loras, list):
        return ""
    sources = sorted({item["source"] for item in loras if isinstance(item, dict) and isinstance(item.get("source"), str)})
    return hashlib.sha256("\n".join(sources).encode()).hexdigest()[:16] if sources else ""


class SubmitTask(_Strict):
    """POST /v1/tasks. `input` holds prompt, width, height, steps, seed, output_format."""

    # Free-form beyond its prompt: each worker validates the rest against its own limits.
    input: dict[str, Any] = Field(json_schema_extra={
        "required": ["prompt"], "properties": {"prompt": {"type": "string", "minLength": 1, "pattern": r"\S"}}})
    model: ModelId | None = Field(None, description=(
        "one of the fleet's models (GET /v1/models); absent: the fleet's default. Only a worker that "
        "holds it or can load it leases the task"))
    priority: int = Field(0, ge=-1000, le=1000, description="higher is leased first")
    idempotency_key: str | None = Field(None, min_length=1, max_length=200)
    max_attempts: int | None = Field(None, ge=1, le=20, description="defaults to the scheduler's")
    webhook: Webhook | None = None

    @field_validator("input")
    @classmethod
    def _a_prompt_shown_as_written(cls, value: dict[str, Any]) -> dict[str, Any]:
        # Checked here, not only by workers: a task without a prompt can only fail once leased, and
        # the prompt is shown (status page, logs) as soon as it is stored.
        prompt = value.get("prompt")
        if not isinstance(prompt, str):
            raise ValueError("input.prompt: required, a string" if prompt is None else
                             f"input.prompt: must be a string, not {type(prompt).__name__}")
        if not prompt.strip():
            raise ValueError("input.prompt: must not be empty")
        if found := bidi_control(prompt):
            raise ValueError(f"input.prompt: contains {found}, a bidirectional control character, which would "
                             "reorder the text shown around the prompt")
        return value


class ErrorEnvelope(_Strict):
    code: str = Field(min_length=1, max_length=100)
    message: str = Field(max_length=4000)
    retryable: bool
    worker_id: str | None = None
    # Machine-readable specifics, e.g. the safety category and score of an unsafe_prompt.
    details: dict[str, Any] | None = None


MAX_IMAGES = 64  # images one result may list


class ImageResult(_Wire):
    """One image of a task (input.num_images; image i has seed `seed + i`): stored, or withheld
    because the image check refused it (nothing of it stored where results go)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    index: int = Field(ge=0, lt=MAX_IMAGES)
    seed: int
    uri: str | None = Field(None, max_length=4096)
    url: str | None = Field(None, max_length=8192)
    content_type: str | None = Field(None, max_length=200)
    bytes: int | None = None
    sha256: str | None = Field(None, max_length=128)
    withheld: ErrorEnvelope | None = Field(None, description="why the image check refused it (code unsafe_image)")

    @model_validator(mode="after")
    def _stored_or_withheld(self) -> "ImageResult":
        if (self.withheld is None) == (self.uri is None):
            raise ValueError("an image is either stored (uri) or withheld (withheld), not both or neither")
        return self


class AdapterUsed(_Wire):
    """A LoRA adapter a task's images were made with (input.loras): where it came from, at what
    scale, and which file (its sha256, recorded whether or not the task gave one)."""

    source: str = Field(max_length=2000)
    scale: float
    sha256: str = Field(max_length=64)


class TaskResult(_Wire):
    """What a worker delivers. Extra keys are kept so newer workers can add fields. The top-level
    fields describe the first image stored; `images` lists every image the task asked for."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    uri: str = Field(max_length=4096)
    content_type: str = Field(max_length=200)
    width: int
    height: int
    seed: int
    bytes: int
    sha256: str = Field(max_length=128)
    url: str | None = Field(None, max_length=8192, description="a signed HTTPS URL, when the worker is configured to sign")
    timings_ms: dict[str, float] = Field({}, max_length=64, description="wall time per stage: lease, text_check, admit, wait, "
                                         "broadcast, embed, denoise, vae, gather, generate, image_check, encode, store")
    batch_size: int = Field(1, description="images generated together with this one on its rank")
    rank: int = Field(0, description="the rank that generated it (data-parallel mode)")
    model: str | None = Field(None, max_length=200, description="the model that made it")
    loras: list[AdapterUsed] = Field([], max_length=64, description="the adapters its images were made with")
    images: list[ImageResult] = Field([], max_length=MAX_IMAGES, description=(
        "every image of the task in index order, each stored or withheld; empty from a worker that predates it"))


class TaskView(_Strict):
    id: str
    status: TaskStatus
    input: dict[str, Any]
    model: str | None = Field(None, description="the model it is made with; none on a fleet that does not "
                              "route by model (models.ids empty)")
    priority: int
    attempts: int
    max_attempts: int
    idempotency_key: str | None
    worker_id: str | None
    result: TaskResult | None
    error: ErrorEnvelope | None
    created_at: float
    updated_at: float
    started_at: float | None
    finished_at: float | None
    cancel_requested_at: float | None = Field(None, description=(
        "when a client asked to cancel it while a worker held it; it ends `cancelled`"))
    expires_at: float | None = Field(None, description=(
        "once ended: when the scheduler removes the task (its retention); GET then answers 404"))
    webhook: Webhook | None = None
    webhook_attempts: list[WebhookAttempt] = Field([], description="each delivery attempt, oldest first")


class TaskList(_Strict):
    tasks: list[TaskView]


MAX_BATCH = 1000


class SubmitBatch(_Strict):
    """POST /v1/tasks/batch: up to 1,000 tasks in one call, stored in one transaction."""

    tasks: list[SubmitTask] = Field(min_length=1, max_length=MAX_BATCH)


class SubmittedBatch(_Strict):
    tasks: list[TaskView]
    created: list[bool] = Field(description="false where an idempotency key replayed an earlier task")


class ModelFigures(_Strict):
    queued: int
    oldest_queued_age_s: float | None
    running: int = Field(description="leased or processing")
    warm_workers: int = Field(description="live workers holding it resident")
    loadable_workers: int = Field(description="live workers that can load it without holding it")


class QueueFigures(_Strict):
    """GET /v1/queue: what autoscalers and dashboards need, from one consistent read."""

    queued_by_priority: dict[str, int] = Field(description="priority -> queued tasks")
    queued: int
    oldest_queued_age_s: float | None
    running: int = Field(description="leased or processing")
    ended_last_s: dict[str, dict[str, int]] = Field(
        description="window in seconds (60, 300, 900) -> {succeeded, failed}: tasks that ended within it")
    workers_by_status: dict[str, int]
    ended_per_s: float = Field(0.0, description="the end rate: tasks ended per second lately (the last 30 s); "
                               "0: too few to tell")
    drain_per_s: float = Field(0.0, deprecated=True, description="deprecated, removed in the next release: "
                               "ended_per_s under its old name")
    wait_s_by_priority: dict[str, float] = Field(
        default_factory=dict, description="priority -> seconds a task submitted now would wait at the end rate "
        "(the tasks of its priority and above, ahead of it); submissions are refused beyond api.max_queue_wait_s")
    models: dict[str, ModelFigures] = Field(
        default_factory=dict, description="per model of the fleet (models.ids): the autoscaling signal per model")


class ModelsView(_Strict):
    """GET /v1/models: the models this fleet serves, and how each is routed."""

    default: str | None = Field(description="the model of a task that names none")
    cold_wait_s: float = Field(description=(
        "how long a task waits for a worker holding its model before one that would have to load it "
        "takes it"))
    models: dict[str, ModelFigures]


# ---------------------------------------------------------------- workers


class DeviceInfo(_Strict):
    name: str = Field(max_length=200)
    memory_bytes: int = Field(ge=0)
    uuid: str | None = Field(None, max_length=100, description="the GPU's UUID, where there is one")


class WorkerLimits(_Strict):
    """What a worker accepts in a task's input (its config's `limits`): the scheduler refuses at
    submission what no live worker accepts. Defaults fill a width or height the input leaves out."""

    max_prompt_chars: int = Field(ge=1)
    min_side: int = Field(ge=1)
    max_side: int = Field(ge=1)
    size_multiple: int = Field(16, ge=1, description="width and height must be multiples of it")
    max_pixels: int = Field(ge=1, description="width x height")
    default_width: int = Field(ge=1)
    default_height: int = Field(ge=1)
    max_steps: int = Field(ge=1, description="steps lie in [1, max_steps]")
    output_formats: list[Annotated[str, StringConstraints(max_length=20)]] = Field(min_length=1, max_length=20)
    # 1: a worker that predates num_images (it refuses the field as unknown).
    max_images: int = Field(1, ge=1, description="num_images lies in [1, max_images]")
    max_adapters: int = Field(0, ge=0, description="loras holds at most this many adapters (0: none)")


class WorkerModels(_Strict):
    """The models a worker can serve: those it holds resident (loaded, warmed up: a task starts at
    once) and those it can load (a swap first: seconds to minutes)."""

    resident: list[ModelId] = Field([], max_length=MAX_MODELS)
    loadable: list[ModelId] = Field([], max_length=MAX_MODELS)


class RegisterWorker(_Strict):
    hostname: str = Field(min_length=1, max_length=255)
    world_size: int = Field(ge=1, le=MAX_DEVICES)
    devices: list[DeviceInfo] = Field(max_length=MAX_DEVICES)
    model: str = Field(max_length=200)
    version: str = Field(max_length=200)
    node_id: str | None = Field(None, min_length=1, max_length=255, description=(
        "the same across restarts of one launch (e.g. host and torchrun run id): a registration with "
        "it replaces the earlier ones, whose leased tasks are requeued at once"))
    ops_url: str | None = Field(None, max_length=300, pattern=r"^https?://", description=(
        "the worker's /metrics, /livez and /readyz; listed for status pages and Prometheus discovery"))
    limits: WorkerLimits | None = Field(None, description=(
        "what it accepts in a task's input; none: the scheduler assumes it may serve anything"))
    models: WorkerModels | None = Field(None, description=(
        "the models it holds and can load; none: it holds `model` alone"))


class Registered(_Strict):
    worker_id: str
    lease_ttl_s: float


class WorkerView(_Strict):
    id: str
    hostname: str
    world_size: int
    devices: list[DeviceInfo]
    model: str
    version: str
    node_id: str | None = None
    ops_url: str | None = None
    limits: WorkerLimits | None = None
    models: WorkerModels | None = Field(None, description="as last told (registration, heartbeat or lease)")
    adapters: list[str] = Field([], description=(
        "the sets of LoRA adapters it holds loaded (adapter_set_key), as its lease last said or a claim gave it"))
    status: RegistrationStatus
    in_flight: list[str]
    warnings: list[str] = Field([], description="e.g. a safety check switched off by config")
    counters: dict[str, int] = Field({}, description="totals since the worker started")
    safety_policy: str | None = Field(None, description="the prompt policy's version, from its heartbeat")
    registered_at: float
    last_heartbeat: float | None
    last_heartbeat_age_s: float | None = Field(None, description="seconds since the last heartbeat")


class _SaysAdapters(_Strict):
    """A worker's call that may say which sets of adapters it holds: said only when it holds or
    held any, so a worker without adapters sends what schedulers before the field accept."""

    @model_serializer(mode="wrap")
    def _unsaid(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("adapters", ()) is None:
            del data["adapters"]
        return data


class LeaseRequest(_SaysAdapters):
    max_tasks: int = Field(1, ge=1, le=256)
    wait_s: float = Field(0.0, ge=0.0, le=60.0, description="long-poll: wait this long for work")
    resident: list[ModelId] | None = Field(None, max_length=MAX_MODELS, description=(
        "the models it holds resident now; absent: as it last said"))
    adapters: list[AdapterSetKey] | None = Field(None, max_length=MAX_ADAPTER_SETS, description=(
        "the sets of adapters it holds loaded now (adapter_set_key of their tasks' input.loras); "
        "absent: as it last said"))


class Lease(_Strict):
    task_id: str
    input: dict[str, Any]
    # When the task was submitted: the same on every attempt, so workers can name its object by date.
    created_at: float
    lease_token: str
    lease_deadline: float
    lease_ttl_s: float
    attempt: int
    model: str | None = Field(None, description="the task's model (a lease's tasks share one)")


class LeaseResponse(_Strict):
    leases: list[Lease]


class Heartbeat(_Strict):
    status: WorkerStatus
    in_flight: list[Id] = Field([], max_length=MAX_IN_FLIGHT)
    timestamp: float
    warnings: list[Text] = Field([], max_length=100)
    counters: dict[Annotated[str, StringConstraints(max_length=100)], int] = Field({}, max_length=256)
    safety_policy: str | None = Field(None, max_length=100, description=(
        "the version of the prompt policy's lists the worker checks with"))
    models: WorkerModels | None = Field(None, description="what it holds and can load, when that changed; "
                                        "absent: as it last said")


class HeartbeatReply(_Strict):
    renewed: dict[str, float] = Field(description="task id -> new lease deadline")
    lost: list[str] = Field(description="in-flight ids whose lease this worker no longer holds")
    cancelled: list[str] = Field([], description=(
        "in-flight ids a client cancelled: drop them if not started, discard their results if started, "
        "and report them `failed` with code `cancelled`; a `succeeded` report for them is refused (409)"))


class Report(_Strict):
    worker_id: Id
    lease_token: Id
    status: ReportStatus
    result: TaskResult | None = None
    error: ErrorEnvelope | None = None
    at: float | None = Field(None, description=(
        "when the worker did what it reports (its clock, Unix seconds): a `processing` report sent "
        "later than the start, in an exchange, sets the task's `started_at` to it (never later than "
        "the scheduler's now, nor earlier than the task's creation); absent: when the scheduler hears"))

    @model_validator(mode="after")
    def _payload_matches_status(self) -> "Report":
        if self.status == "succeeded" and self.result is None:
            raise ValueError("status 'succeeded' needs a result")
        if self.status == "failed" and self.error is None:
            raise ValueError("status 'failed' needs an error")
        if self.status != "succeeded" and self.result is not None:
            raise ValueError(f"status {self.status!r} cannot carry a result")
        return self


class TaskReport(Report):
    """One report of a batch: the task it is about, and the report."""

    task_id: Id


class ReportBatch(_Strict):
    """POST /v1/reports: several tasks' reports in one call (e.g. a round's), applied in one
    transaction, each on its own: one refused report does not refuse the others."""

    reports: list[TaskReport] = Field(min_length=1, max_length=256)


class Exchange(_SaysAdapters):
    """POST /v1/workers/{wid}/exchange: a worker's one call per task in steady state. It carries the
    reports since its last call (results, and the `processing` notes of the tasks it admitted, each
    with its own `at`) and its request for more tasks; the answer carries each report's outcome,
    the new leases (long-polling as a lease does) and the cancel notices of the tasks it holds."""

    exchange_id: Id = Field(description=(
        "the worker's name for this exchange, the same on each of its retries: tasks claimed for it "
        "are answered again to a retry rather than claimed twice"))
    retry: bool = Field(False, description="a retry of an exchange whose answer did not arrive")
    reports: list[TaskReport] = Field([], max_length=256)
    held: list[Id] = Field([], max_length=MAX_IN_FLIGHT, description=(
        "the tasks it holds whose final report is not in this call: the answer's `cancelled` names "
        "those a client cancelled"))
    max_tasks: int = Field(0, ge=0, le=256, description="new tasks wanted; 0: none")
    wait_s: float = Field(0.0, ge=0.0, le=60.0, description="long-poll: wait this long for new tasks")
    resident: list[ModelId] | None = Field(None, max_length=MAX_MODELS, description=(
        "the models it holds resident now; absent: as it last said"))
    adapters: list[AdapterSetKey] | None = Field(None, max_length=MAX_ADAPTER_SETS, description=(
        "the sets of adapters it holds loaded now, as a lease says them; absent: as it last said"))


class ReportOutcome(_Strict):
    task_id: str
    status_code: int = Field(description="what POST /v1/tasks/{id}/report would answer: 200, 404 or 409")
    task: TaskView | None = None
    detail: str | None = None


class ReportOutcomes(_Strict):
    results: list[ReportOutcome]


class Exchanged(_Strict):
    results: list[ReportOutcome] = Field(description="each report's outcome, in the order sent")
    leases: list[Lease] = Field(description="new tasks (to a retry: those claimed for its exchange_id)")
    cancelled: list[str] = Field(description=(
        "held ids a client cancelled: drop them if not started, discard their results if started, "
        "and report them `failed` with code `cancelled`"))
