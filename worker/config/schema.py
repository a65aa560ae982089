"""The worker's configuration tree: one typed section per component, each component receiving only
its own. Rules that span sections (timeouts that must nest, speed switches the device field rules
out) are checked here, so a combination that cannot work is refused at start, naming the field.
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from safety.config import SafetyConfig
from tomlconf import LoggingConfig, Section

class QueueConfig(Section):
    url: str = Field("http://127.0.0.1:8700", description="the scheduler's base URL")
    # Name of the environment variable holding the bearer token; read at start, never stored here.
    token_env: str = "DIT_WORKER_TOKEN"
    timeout_s: float = Field(10.0, gt=0, description="seconds per HTTP call to the scheduler (a lease call: plus "
                             "its long-poll wait)")
    lease_wait_s: float = Field(10.0, ge=0, le=60, description="long-poll wait per lease call")
    # The most one lease call asks for.
    max_tasks: int = Field(8, ge=1, le=256)
    # Admitted tasks a worker holds waiting for a round: enough to fill every rank and to pick
    # batches that balance them, few enough not to hoard what other workers could run.
    # 0: auto, two rounds (2 x batch.max_size x ranks in data mode). At least one round.
    lease_ahead: int = Field(0, ge=0, le=1024, description="tasks held ahead of generation; 0: auto")
    heartbeat_interval_s: float = Field(30.0, gt=0, description="seconds between heartbeats, which renew the "
                                        "leases of the tasks held")
    exchange: bool = Field(True, description=(
        "lease and report in one call (POST /v1/workers/{id}/exchange): half the calls per task, and "
        "a fleet's load held with fewer refusals (docs/queue.md); false: separate lease and report "
        "calls. A scheduler without it turns it off by itself"))
    lease_hold_s: float = Field(2.0, ge=0, le=60, description=(
        "with the exchange: how long a request for more tasks waits, while a round is still ready, "
        "for a report's call to carry it; 0: asked at once"))
    # How long a result report keeps retrying before the lease expiry takes over.
    report_deadline_s: float = Field(45.0, gt=0)
    idle_backoff_max_s: float = Field(10.0, gt=0, description="cap on waits while the queue is down")


class DistributedConfig(Section):
    backend: Literal["auto", "nccl", "gloo"] = Field("auto", description="torch.distributed backend; auto: NCCL on "
                                                     "CUDA, gloo on CPU")
    # Loading 30 GB of weights and compiling can take many minutes; serving collectives cannot.
    load_timeout_s: float = Field(1800.0, gt=0)
    serve_timeout_s: float = Field(120.0, gt=0, description="seconds a collective may take once serving "
                                   "(after loading and warm-up)")


class ModelConfig(Section):
    name: str = Field("flux.1-schnell", description="the model's id, as tasks and the scheduler's models.ids "
                      "name it")
    source: str = Field("black-forest-labs/FLUX.1-schnell", description="Hub id or local directory")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit) of `source`; unset: "
                                 "the default branch")
    dtype: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="torch dtype the "
                                                              "pipeline's weights are loaded in")
    device: Literal["auto", "cuda", "cpu"] = Field("auto", description="auto: CUDA when visible, else the CPU "
                                                   "for a float32 model only")
    guidance_scale: float = Field(0.0, description="guidance scale passed to the pipeline (FLUX.1-schnell: 0)")
    max_sequence_length: int = Field(256, ge=1, le=512, description="T5 tokens a prompt is encoded to; the "
                                     "rest is cut off")
    # Benchmarks only: build this architecture with random weights instead of loading `source`.
    # Speed does not depend on the values; the images are noise.
    random_arch: Literal["none", "tiny", "tiny-pixart", "flux.1-schnell"] = "none"
    # Several models on one worker ([models.<id>]): a resident model whose priority is twice
    # another's must sit idle twice as long before it is evicted for a swap.
    priority: float = Field(1.0, gt=0)
    # Its size resident, against swap.memory_budget_mb; 0: what its weights measure once loaded
    # (before its first load, it is assumed to need the whole budget).
    memory_mb: int = Field(0, ge=0)


class SwapConfig(Section):
    """How a worker with several models ([model] and [models.<id>]) holds them: rank 0 decides a
    swap and every rank loads and warms up in lockstep before that model's tasks run."""

    # What the resident models may take together; 0: one model resident at a time.
    memory_budget_mb: int = Field(0, ge=0)


class LoraConfig(Section):
    """LoRA adapters a task may bring (input.loras): where they may come from, how large, and the
    node's disk cache of them (worker.adapters). Nothing is fetched from a source the operator did
    not allow or register: with neither `allow` nor `registered`, a task may bring none."""

    max_adapters: int = Field(3, ge=0, le=8, description="adapters one task may bring; 0: none")
    max_rank: int = Field(64, ge=1, le=1024, description="the largest LoRA rank accepted")
    max_mb: int = Field(512, ge=1, description="the largest adapter file, MiB")
    max_scale: float = Field(4.0, gt=0, description="a task's scale lies in [-max_scale, max_scale]")
    # URL prefixes, each a scheme and host and a path ending in "/": https://huggingface.co/acme/,
    # gs://adapters/flux/. A redirect must land under one too (a CDN host is listed as well).
    allow: tuple[str, ...] = Field((), description="where adapters may be fetched from (URL prefixes)")
    # Names a task may give as its source, each for a URL the operator chose (allowed or not).
    registered: dict[str, str] = Field(default_factory=dict, description="adapter name -> its URL")
    cache_dir: str = Field("/var/tmp/dit-worker/adapters", description="the node's cache, shared by its ranks")
    cache_mb: int = Field(8192, ge=1, description="what the cache may hold; the least recently used go first")
    fetch_timeout_s: float = Field(120.0, gt=0, description="one adapter's whole download")
    keep: int = Field(8, ge=1, le=64, description="adapters each rank's pipeline holds loaded between rounds")
    # A slow download holds its own task only: the others of its lease, and later leases, go on.
    fetches: int = Field(4, ge=1, le=32, description="adapter downloads rank 0 runs at once")

    @property
    def accepted(self) -> int:
        """How many adapters a task may bring here: none when no source is allowed or registered."""
        return self.max_adapters if (self.allow or self.registered) else 0

    @field_validator("allow")
    @classmethod
    def _prefixes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for i, prefix in enumerate(value):
            if not re.match(r"^(https?://[^/@\s]+|gs://[a-z0-9][a-z0-9._-]{1,220})/", prefix) or ".." in prefix:
                raise ValueError(f"[{i}] {prefix!r}: an http(s):// host or gs:// bucket, then a path ending in /")
            if not prefix.endswith("/"):
                raise ValueError(f"[{i}] {prefix!r}: must end in / (a prefix of whole path segments)")
        return value

    @field_validator("registered")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, url in value.items():
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$", name):
                raise ValueError(f"{name!r}: a name of letters, digits, _ . : - (at most 100)")
            if not re.match(r"^(https?://[^/@\s]+|gs://[^/\s]+)/\S+$", url):
                raise ValueError(f"{name}: {url!r} is not an http(s):// or gs:// URL of a file")
        return value


class LimitsConfig(Section):
    """What a request may ask for; validation refuses anything outside it."""

    max_prompt_chars: int = Field(2000, ge=1, description="longest prompt accepted, in characters")
    min_side: int = Field(256, ge=16, description="smallest width or height, in pixels (a multiple of 16)")
    max_side: int = Field(2048, ge=16, description="largest width or height, in pixels (a multiple of 16)")
    max_pixels: int = Field(2048 * 2048, ge=256, description="largest width x height, in pixels")
    default_width: int = Field(1360, description="width of a task that gives none, in pixels")
    default_height: int = Field(768, description="height of a task that gives none, in pixels")
    default_steps: int = Field(4, ge=1, description="denoising steps of a task that gives none")
    max_steps: int = Field(8, ge=1, description="most denoising steps a task may ask for")
    # Hosted FLUX APIs offer 1-4. A task's images share its rounds' batches (batch.max_size images a
    # rank generates at once): more than that are made in several passes of one round.
    max_images: int = Field(4, ge=1, le=16, description="most images one task may ask for (input.num_images)")
    # The first is the default; a task may ask for any other listed here. JPEG first: on a
    # photograph at 1360x768 it encodes in about 4 ms on one core, WebP in 29 (method 0), PNG in 78
    # at its fastest level (make bench-post); JPEG is also the default of hosted FLUX APIs.
    output_formats: tuple[Literal["png", "webp", "jpeg"], ...] = ("jpeg", "webp", "png")

    @model_validator(mode="after")
    def _consistent(self) -> "LimitsConfig":
        for name in ("min_side", "max_side", "default_width", "default_height"):
            if getattr(self, name) % 16:
                raise ValueError(f"{name} must be a multiple of 16")
        if not self.min_side <= self.default_width <= self.max_side:
            raise ValueError("default_width must lie within [min_side, max_side]")
        if not self.min_side <= self.default_height <= self.max_side:
            raise ValueError("default_height must lie within [min_side, max_side]")
        if self.default_steps > self.max_steps:
            raise ValueError("default_steps must not exceed max_steps")
        return self


class EncodeConfig(Section):
    """Each format's settings, chosen for latency on photographs at 1360x768 (make bench-post): PNG
    level 1 is 4.6x faster than level 6 for about 15% more bytes; WebP method 0 3x faster than 4
    for about 10% more."""

    png_compress_level: int = Field(1, ge=0, le=9, description="zlib level: 0 none, 1 fastest .. 9 smallest")
    jpeg_quality: int = Field(95, ge=1, le=100, description="JPEG quality, 1 worst .. 100 best")
    webp_quality: int = Field(90, ge=1, le=100, description="WebP quality, 1 worst .. 100 best")
    webp_method: int = Field(0, ge=0, le=6, description="0 fast .. 6 small")


class WarmupConfig(Section):
    # (width, height) pairs generated once before the worker reports ready.
    sizes: tuple[tuple[int, int], ...] = ((1360, 768),)
    prompt: str = Field("a lighthouse on a cliff at dawn", description="the prompt the warm-up generates")


class BatchConfig(Section):
    """Compatible tasks (same size and steps) generated together, each with its own seed."""

    max_size: int = Field(1, ge=1, le=64, description="images per rank per generation")
    # How long a partial batch waits for more compatible tasks before it starts anyway.
    window_s: float = Field(0.0, ge=0, le=10)


class ParallelConfig(Section):
    """How the ranks share work. data: each rank generates its own share of a round of tasks.
    context: all ranks generate the same images together (diffusers context parallelism), for the
    lowest latency per image."""

    mode: Literal["data", "context"] = Field("data", description="data: each rank its own tasks; context: all "
                                             "ranks on the same images")
    # context mode: Ulysses (all-to-all of heads) or Ring (needs an attention backend returning LSE).
    context_kind: Literal["ulysses", "ring"] = "ulysses"


class SpeedConfig(Section):
    """Per-device speed-ups, each independent; validated together at start and warmed up for every
    warm-up size and batch size before the worker reports ready."""

    compile: bool = Field(False, description="torch.compile the transformer")
    compile_vae: bool = Field(False, description="torch.compile the VAE decoder")
    # T5-XXL and CLIP see one fixed shape (max_sequence_length and 77 tokens, one prompt a call), so
    # one compile each; eager they are bound by kernel launches, not by the GPU.
    compile_text: bool = Field(False, description="torch.compile the text encoders (T5, CLIP)")
    compile_mode: Literal["default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead"] = Field(
        "default", description="torch.compile mode of every compile the speed.compile* switches ask for")
    # model: the whole transformer, one graph. blocks: each repeated block (diffusers
    # compile_repeated_blocks): the 57 blocks share the compile of their two kinds, so far less
    # compile time; the embedders and the final layers run eager.
    compile_scope: Literal["model", "blocks"] = "model"
    # Inductor's caches on the node's disk, one folder per torch/device fingerprint, so a restart
    # skips most of the compile. "": torch's default (a per-user temporary folder).
    compile_cache_dir: str = ""
    fuse_qkv: bool = Field(False, description="fused QKV projections in the transformer")
    channels_last_vae: bool = Field(False, description="VAE in channels_last memory format")
    # diffusers attention backend name (e.g. native, flash, _native_cudnn, sage); "" keeps the default.
    attention_backend: str = ""
    fp8: bool = Field(False, description="torchao fp8 dynamic activation+weight on the layers that gain")
    fp8_scales: Literal["row", "tensor"] = Field("row", description="one scale per row, or per tensor")
    prompt_cache_size: int = Field(0, ge=0, le=100_000, description="prompt embeddings kept; 0: off")
    # For cards too small to hold every component: model keeps one component at a time on the
    # device; sequential streams layers (much slower, least memory).
    offload: Literal["none", "model", "sequential"] = "none"


class LocalStorageConfig(Section):
    root: str = Field("outputs", description="folder the images are written to, one file per task; relative: "
                      "to the working directory")


NAME_FIELDS = ("prefix", "yyyy", "mm", "dd", "task_id", "ext", "model")


class GCSConfig(Section):
    """Google Cloud Storage. Credentials: `credentials_file` (a service-account key) or Application
    Default Credentials; STORAGE_EMULATOR_HOST is honoured (no auth against an emulator)."""

    bucket: str = Field(min_length=3, max_length=222, description="the bucket's name")
    prefix: str = Field("results", description="{prefix} of object_name: the folder results go under")
    # The date is the task's submission date, the same on every attempt: one object per image. {task_id}
    # is the task id for its first image, `<task id>~<index>` for the others (input.num_images).
    object_name: str = "{prefix}/{yyyy}/{mm}/{dd}/{task_id}.{ext}"
    project: str | None = Field(None, description="GCP project of the client; unset: inferred from the "
                                "credentials or environment")
    credentials_file: str | None = Field(None, description="a service-account key (JSON); unset: Application "
                                         "Default Credentials")
    cache_control: str | None = Field("private, max-age=31536000, immutable", description="Cache-Control of "
                                      "each object; unset: none")
    include_prompt: bool = Field(False, description="store the prompt itself in the object's metadata")
    signed_url_ttl_s: int = Field(0, ge=0, le=7 * 24 * 3600, description="0: no signed URL")
    timeout_s: float = Field(30.0, gt=0, description="per HTTP request")
    deadline_s: float = Field(60.0, gt=0, description="all retries of one upload; then storage_unavailable")
    backoff_initial_s: float = Field(0.5, gt=0, description="longest wait before the first retry, in seconds; "
                                     "doubles per retry (full jitter)")
    backoff_max_s: float = Field(8.0, gt=0, description="cap on the wait between two retries, in seconds")

    @model_validator(mode="after")
    def _name_template(self) -> "GCSConfig":
        fields = {f for _, f, _, _ in string.Formatter().parse(self.object_name) if f is not None}
        if unknown := fields - set(NAME_FIELDS):
            raise ValueError(f"object_name: unknown field(s) {', '.join(sorted(unknown))}; "
                             f"use {', '.join(NAME_FIELDS)}")
        if "task_id" not in fields:
            raise ValueError("object_name: must contain {task_id}, or tasks would overwrite each other")
        return self


class StoreTarget(Section):
    kind: Literal["local", "gcs"] = Field("local", description="local: a folder ([local]); gcs: a bucket ([gcs])")
    local: LocalStorageConfig = LocalStorageConfig()
    gcs: GCSConfig | None = None

    @model_validator(mode="after")
    def _gcs_needs_bucket(self) -> "StoreTarget":
        if self.kind == "gcs" and self.gcs is None:
            raise ValueError("gcs: kind 'gcs' needs a [gcs] section with a bucket")
        return self


class StorageConfig(StoreTarget):
    # Checks, encoding and upload run in a pool on rank 0 while the next round generates. Both follow
    # the node when 0 (auto): `workers` one thread per image of a round (at least 2), `max_pending`
    # two rounds. An explicit `max_pending` must hold at least one round.
    workers: int = Field(0, ge=0, le=256, description="post-stage threads on rank 0; 0: auto")
    max_pending: int = Field(0, ge=0, le=4096, description="generated, not yet reported; then wait. 0: auto")
    # Where images the image check flagged go, for review; unset: they are not kept anywhere.
    quarantine: StoreTarget | None = None

    @model_validator(mode="after")
    def _quarantine_apart(self) -> "StorageConfig":
        q = self.quarantine
        if q is not None and q.kind == self.kind and _location(q) == _location(self):
            raise ValueError("quarantine: must not be the results location (flagged images would be published)")
        return self


def _location(t: StoreTarget) -> tuple:
    if t.kind == "gcs":
        return (t.gcs.bucket, t.gcs.prefix)
    return (str(Path(t.local.root).resolve()),)


class DeadlinesConfig(Section):
    """How long a task may stay in each stage. The heartbeat renews a task's lease only while its
    stage is within its deadline; past it the task fails retryable (deadline_exceeded) at once, and
    whatever the stage produces later is discarded. A serve loop without progress for `stall_s`
    gives its tasks back and exits, so torchrun restarts the group."""

    admit_s: float = Field(30.0, gt=0, description="validation, text check, processing report")
    # A task's LoRA adapters fetched into the node's cache, each within lora.fetch_timeout_s (the
    # default covers three at the default 120 s, one after another).
    fetch_s: float = Field(400.0, gt=0, description="a task's adapters fetched (input.loras)")
    generate_s: float = Field(120.0, gt=0, description="one round, broadcast to gather")
    check_s: float = Field(30.0, gt=0, description="quality and image check of one image")
    encode_s: float = Field(30.0, gt=0, description="encoding one image into its output format")
    store_s: float = Field(90.0, gt=0, description="one upload with its retries")
    # From the end of the post stage to the final report, with the wait for earlier tasks (results
    # are reported in lease order) and the report's own retries (queue.report_deadline_s).
    report_s: float = Field(180.0, gt=0)
    stall_s: float = Field(300.0, gt=0, description="serve loop without a finished turn; then exit")
    # A swap to another model ([models.<id>]): evict, load and warm up on every rank. The round
    # that needs it waits this long at most; the serve loop is not stalled meanwhile.
    swap_s: float = Field(900.0, gt=0, description="a swap: evict, load and warm up another model")

    @model_validator(mode="after")
    def _stall_outlives_a_turn(self) -> "DeadlinesConfig":
        turn = self.generate_s + self.check_s + self.encode_s + self.store_s
        if self.stall_s <= turn:
            raise ValueError(f"stall_s must exceed generate_s + check_s + encode_s + store_s ({turn:.0f}s): a "
                             "turn waits for one round and for the oldest post stage")
        return self


class OpsConfig(Section):
    """Rank 0's HTTP endpoint for operators: /metrics (Prometheus), /livez, /readyz. The address
    goes to the scheduler at registration, so its status page and Prometheus can find every worker."""

    enabled: bool = Field(True, description="serve /metrics, /livez and /readyz on rank 0")
    host: str = Field("0.0.0.0", description="address the endpoint listens on; 0.0.0.0: every interface")
    # 0: any free port (logged and registered). Give each worker on one host its own.
    port: int = Field(9400, ge=0, le=65535)
    gpu_metrics: bool = Field(True, description="temperature, power, clocks, utilisation via NVML where present")
    profile_dir: str = Field("", description="where POST /profile?rounds=N writes torch.profiler traces of "
                             "rank 0's next N rounds; empty: no /profile endpoint")


class OtherModelConfig(ModelConfig):
    """A [models.<id>] section: a model the worker can swap in, like [model], with its own
    [models.<id>.limits], [models.<id>.warmup] and [models.<id>.speed] where they differ from the
    worker's (absent: the worker's own sections, whole)."""

    limits: LimitsConfig | None = None
    warmup: WarmupConfig | None = None
    speed: SpeedConfig | None = None


class WorkerConfig(Section):
    """The whole tree: one section per component. A section the file leaves out takes its defaults."""

    queue: QueueConfig
    distributed: DistributedConfig
    model: ModelConfig
    limits: LimitsConfig
    warmup: WarmupConfig
    batch: BatchConfig
    parallel: ParallelConfig
    speed: SpeedConfig
    encode: EncodeConfig
    storage: StorageConfig
    safety: SafetyConfig
    deadlines: DeadlinesConfig
    logging: LoggingConfig
    ops: OpsConfig
    swap: SwapConfig
    lora: LoraConfig
    # Other models this worker can load, by id (the scheduler's models.ids): [models.<id>], each
    # like [model]; [model] is the one loaded at start.
    models: dict[str, OtherModelConfig] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _missing_sections_are_empty(cls, data):
        if not isinstance(data, dict):
            return data
        data = {**{name: {} for name in cls.model_fields}, **data}
        if isinstance(data["models"], dict):  # each named by its key, on [model]'s device unless it says
            device = data["model"].get("device", "auto") if isinstance(data["model"], dict) else "auto"
            data["models"] = {k: {"device": device, **v, "name": k} if isinstance(v, dict) else v
                              for k, v in data["models"].items()}
        return data

    @property
    def catalog(self) -> dict[str, ModelConfig]:
        """Every model this worker serves, by id: [model] first."""
        return {self.model.name: self.model, **self.models}

    def limits_of(self, name: str) -> LimitsConfig:
        """What a task of model `name` may ask for: its own [models.<id>.limits], or [limits]."""
        other = self.models.get(name)
        return other.limits if other and other.limits else self.limits

    def warmup_of(self, name: str) -> WarmupConfig:
        other = self.models.get(name)
        return other.warmup if other and other.warmup else self.warmup

    def speed_of(self, name: str) -> SpeedConfig:
        other = self.models.get(name)
        return other.speed if other and other.speed else self.speed

    @model_validator(mode="after")
    def _collectives_outlive_rank0_io(self) -> "WorkerConfig":
        # Followers wait in a collective while rank 0 long-polls or backs off; that wait must end
        # well before the serve timeout, or an idle worker would kill itself.
        idle = self.queue.lease_wait_s + self.queue.timeout_s + self.queue.idle_backoff_max_s
        if idle >= self.distributed.serve_timeout_s / 2:
            raise ValueError(
                "queue.lease_wait_s + queue.timeout_s + queue.idle_backoff_max_s must be under half "
                f"of distributed.serve_timeout_s ({idle:.0f}s; half is {self.distributed.serve_timeout_s / 2:.0f}s)")
        if self.queue.report_deadline_s >= self.distributed.serve_timeout_s / 2:
            raise ValueError("queue.report_deadline_s must be under half of distributed.serve_timeout_s")
        # After a generation, followers wait while rank 0 runs the image check and reports.
        if self.safety.timeout_s + self.queue.report_deadline_s >= self.distributed.serve_timeout_s / 2:
            raise ValueError("safety.timeout_s + queue.report_deadline_s must be under half of "
                             "distributed.serve_timeout_s")
        if self.deadlines.report_s <= self.queue.report_deadline_s:
            raise ValueError("deadlines.report_s must exceed queue.report_deadline_s (the report's own retries)")
        if self.lora.accepted and self.deadlines.fetch_s < self.lora.fetch_timeout_s:
            raise ValueError(f"deadlines.fetch_s ({self.deadlines.fetch_s:g}) must be at least lora.fetch_timeout_s "
                             f"({self.lora.fetch_timeout_s:g}): a download allowed that long would fail its task")
        for name, where in self._sections():
            _warmup_fits(self.warmup_of(name), self.limits_of(name), where)
            self._speed_fits_device(self.speed_of(name), self.catalog[name], where)
        self._models_fit()
        return self

    def _sections(self) -> list[tuple[str, str]]:
        """Each model and the prefix of its own sections' fields in an error ("" for [model])."""
        return [(self.model.name, ""), *((name, f"models.{name}.") for name in self.models)]

    def _models_fit(self) -> None:
        if self.model.name in self.models:
            raise ValueError(f"models.{self.model.name}: is [model] already (the model loaded at start)")
        for name, m in self.models.items():
            if m.device != self.model.device:
                raise ValueError(f"models.{name}.device: {m.device!r}, but [model] is on {self.model.device!r}: "
                                 "one worker serves from one device")

    def _speed_fits_device(self, sp: SpeedConfig, model: ModelConfig, where: str) -> None:
        """What can be refused from the file alone; worker.model.speed checks the device at start.
        `where`: "" for the worker's [speed] and [model], "models.<id>." for another model's."""
        speed, dev = f"{where}speed" if where and self.models[model.name].speed else "speed", model.device
        if dev == "cpu":
            for name in ("fp8", "offload"):
                if getattr(sp, name) not in (False, "none"):
                    raise ValueError(f"{speed}.{name}: needs a CUDA device ({where or 'model.'}device is cpu)")
        if sp.fuse_qkv and self.lora.accepted:
            raise ValueError(f"{speed}.fuse_qkv: the fused projection would bypass adapters' to_q, to_k and to_v "
                             "layers, silently (lora.allow or lora.registered are set); switch one of them off")
        if sp.fp8 and self.lora.accepted:
            # peft wraps torchao's float8 linears in its TorchaoLoraLinear, which refuses them: every
            # adapter would fail to load (huggingface/diffusers#10621).
            raise ValueError(f"{speed}.fp8: LoRA adapters cannot be loaded into torchao's float8 linear layers "
                             "(lora.allow or lora.registered are set); switch one of them off")
        if sp.fp8 and model.dtype == "float32":
            raise ValueError(f"{speed}.fp8: quantizes a bfloat16/float16 model; set {where or 'model.'}dtype")
        if sp.offload != "none" and self.parallel.mode == "context":
            raise ValueError(f"{speed}.offload: cannot be combined with parallel.mode = 'context'")
        if sp.offload == "sequential" and (sp.compile or sp.fp8):
            raise ValueError(f"{speed}.offload: 'sequential' streams weights layer by layer; "
                             "it cannot be combined with speed.compile or speed.fp8")


def _warmup_fits(warmup: WarmupConfig, lim: LimitsConfig, where: str) -> None:
    for w, h in warmup.sizes:
        if w % 16 or h % 16 or not (lim.min_side <= min(w, h) and max(w, h) <= lim.max_side):
            raise ValueError(f"{where}warmup.sizes: {w}x{h} is not a size the limits allow "
                             f"(multiples of 16 within [{lim.min_side}, {lim.max_side}])")
