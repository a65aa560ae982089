"""Validation of a leased task's input against the worker's limits.

Runs on rank 0 before any GPU work. Every refusal names the field and what is wrong with it, and
fails only that task (code `invalid_request`, not retryable): a retry cannot fix the input.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from protocol import WorkerLimits, bidi_control
from tomlconf import describe_errors
from worker.adapters import AdapterRefused, resolve
from worker.config import LimitsConfig, LoraConfig
from worker.model.job import Job, LoraRef

MAX_SEED = 2**63 - 1
# Widths and heights must be multiples of it (the VAE's 8 x the transformer's 2x2 patches).
SIZE_MULTIPLE = 16
# How a refused input field is described to the client.
INPUT_WORDS = {"extra_forbidden": "unknown field", "missing": "required"}
# Task ids name stored objects, so they must be safe as a path segment on every store.
_TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class InvalidRequest(ValueError):
    """A task input that this worker refuses; str(e) is the reason reported to the client."""


class _Lora(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    source: StrictStr = Field(min_length=1, max_length=2000)
    scale: StrictFloat | StrictInt = 1.0
    sha256: StrictStr | None = Field(None, pattern=r"^[0-9a-f]{64}$")


class _Input(BaseModel):
    # strict: "512" is not 512, true is not 1; extra: unknown fields are refused, not ignored.
    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: StrictStr
    width: StrictInt | None = None
    height: StrictInt | None = None
    steps: StrictInt | None = None
    seed: StrictInt | None = Field(None, ge=0, le=MAX_SEED)
    output_format: StrictStr | None = None
    num_images: StrictInt | None = None
    loras: list[_Lora] | None = Field(None, max_length=64)


def validate_task(task_id: str, raw: Any, limits: LimitsConfig, lora: LoraConfig = LoraConfig()) -> Job:
    if not isinstance(task_id, str) or not _TASK_ID.match(task_id):
        raise InvalidRequest(f"task id {task_id!r} is not a safe object name ([A-Za-z0-9._-], max 128)")
    if not isinstance(raw, dict):
        raise InvalidRequest(f"input must be a JSON object, got {type(raw).__name__}")
    try:
        req = _Input.model_validate(raw)
    except ValidationError as e:
        raise InvalidRequest(describe_errors(e, INPUT_WORDS, root="input")) from None
    job = Job(
        task_id=task_id,
        prompt=_check_prompt(req.prompt, limits),
        width=_check_side("width", req.width, limits.default_width, limits),
        height=_check_side("height", req.height, limits.default_height, limits),
        steps=_check_steps(req.steps, limits),
        seed=req.seed,
        output_format=_check_format(req.output_format, limits),
        num_images=_check_images(req.num_images, req.seed, limits),
        loras=_check_loras(req.loras or [], lora),
    )
    if job.width * job.height > limits.max_pixels:
        raise InvalidRequest(f"width x height = {job.width * job.height} pixels exceeds {limits.max_pixels}")
    return job


def _check_prompt(prompt: str, limits: LimitsConfig) -> str:
    if not prompt.strip():
        raise InvalidRequest("prompt: must not be empty")
    if len(prompt) > limits.max_prompt_chars:
        raise InvalidRequest(f"prompt: {len(prompt)} characters, the limit is {limits.max_prompt_chars}")
    if "\x00" in prompt:
        raise InvalidRequest("prompt: must not contain NUL characters")
    # The reference scheduler refuses these at submission; a task from another scheduler may still carry one.
    if found := bidi_control(prompt):
        raise InvalidRequest(f"prompt: contains {found}, a bidirectional control character, which would reorder "
                             "the text shown around the prompt")
    return prompt


def _check_side(name: str, value: int | None, default: int, limits: LimitsConfig) -> int:
    if value is None:
        return default
    # diffusers would silently round a size that is not a multiple of 16: refuse instead.
    if value % SIZE_MULTIPLE:
        raise InvalidRequest(f"{name}: {value} is not a multiple of {SIZE_MULTIPLE}")
    if not limits.min_side <= value <= limits.max_side:
        raise InvalidRequest(f"{name}: {value} is outside [{limits.min_side}, {limits.max_side}]")
    return value


def _check_steps(value: int | None, limits: LimitsConfig) -> int:
    if value is None:
        return limits.default_steps
    if not 1 <= value <= limits.max_steps:
        raise InvalidRequest(f"steps: {value} is outside [1, {limits.max_steps}]")
    return value


def _check_images(value: int | None, seed: int | None, limits: LimitsConfig) -> int:
    if value is None:
        return 1
    if not 1 <= value <= limits.max_images:
        raise InvalidRequest(f"num_images: {value} is outside [1, {limits.max_images}]")
    # Image i is made with seed + i: the last must be a seed too.
    if seed is not None and seed + value - 1 > MAX_SEED:
        raise InvalidRequest(f"seed: {seed} + num_images - 1 exceeds {MAX_SEED}, the largest seed")
    return value


def _check_loras(loras: list[_Lora], cfg: LoraConfig) -> tuple[LoraRef, ...]:
    if len(loras) > cfg.accepted:
        if not cfg.accepted:
            raise InvalidRequest("loras: this worker takes no adapters (no lora.allow or lora.registered)")
        raise InvalidRequest(f"loras: {len(loras)} adapters, the limit is {cfg.accepted}")
    refs = []
    for i, item in enumerate(loras):
        field = f"input.loras[{i}].source"
        if abs(item.scale) > cfg.max_scale:
            raise InvalidRequest(f"loras[{i}].scale: {item.scale} is outside [-{cfg.max_scale}, {cfg.max_scale}]")
        try:
            source = resolve(item.source, cfg, field)
        except AdapterRefused as e:
            raise InvalidRequest(str(e).removeprefix("input.")) from None
        refs.append(LoraRef(source=source.url, scale=float(item.scale), sha256=item.sha256, field=field))
    return tuple(refs)


def _check_format(value: str | None, limits: LimitsConfig) -> str:
    if value is None:
        return limits.output_formats[0]
    if value not in limits.output_formats:
        raise InvalidRequest(f"output_format: {value!r} is not one of {list(limits.output_formats)}")
    return value


def advertised(limits: LimitsConfig, lora: LoraConfig = LoraConfig()) -> WorkerLimits:
    """What this validation accepts, as the worker's registration tells the scheduler, so that the
    scheduler refuses at submission what no live worker would accept."""
    return WorkerLimits(max_prompt_chars=limits.max_prompt_chars, min_side=limits.min_side, max_side=limits.max_side,
                        size_multiple=SIZE_MULTIPLE, max_pixels=limits.max_pixels, default_width=limits.default_width,
                        default_height=limits.default_height, max_steps=limits.max_steps,
                        output_formats=list(limits.output_formats), max_images=limits.max_images,
                        max_adapters=lora.accepted)
