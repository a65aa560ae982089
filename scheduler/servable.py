"""Whether any live worker could serve a task's input, from the limits workers advertise when they
register (protocol WorkerLimits): pure functions, so the rules are unit-tested apart from HTTP.

Only values are checked against limits (prompt length, sizes, pixels, steps, output format, images), and every
one refused is named at once. Types and unknown fields are left to the worker, which fails such a task
with a reason (a missing or blank prompt the protocol refuses before this). A
fleet with no live worker, or with one that advertised no limits, may serve anything as far as the
scheduler knows: nothing is refused then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol import WorkerLimits

# The order refusals are named in, by field and within a field by kind.
FIELDS = ("input.prompt", "input.width", "input.height", "input", "input.steps", "input.output_format",
          "input.num_images", "input.loras")
KINDS = ("multiple", "above", "below", "format")


@dataclass(frozen=True)
class Refusal:
    """Why one worker's limits refuse one field."""

    field: str
    kind: str  # above, below, multiple, format
    value: Any  # what the input asks for, as the message shows it
    bound: Any  # that worker's limit

    def alone(self) -> str:
        """As said of one worker among several."""
        if self.kind == "multiple":
            return f"{self.field}: {self.value} is not a multiple of {self.bound}"
        if self.kind == "format":
            return f"{self.field}: {self.value!r} is not one of {self.bound}"
        return f"{self.field}: {self.value} is {self.kind} {self.bound}"


def refusal(inp: dict[str, Any], fleet: list[WorkerLimits | None]) -> str | None:
    """Why no worker of `fleet` (the live workers' distinct limits) could serve `inp`, naming the
    field; None when one could, or when the scheduler cannot tell."""
    if not fleet or any(limits is None for limits in fleet):
        return None
    each = [refusals(inp, limits) for limits in fleet]
    if not all(each):
        return None
    said = []
    for field in FIELDS:
        for kind in KINDS:
            found = [next((r for r in mine if r.field == field and r.kind == kind), None) for mine in each]
            if all(found):
                said.append(_everywhere(found))
    if said:
        return "; ".join(said)
    # Every worker refuses something, but not the same field: no single one takes the whole input.
    parts = sorted({mine[0].alone() for mine in each})
    return f"input: no live worker accepts all of it ({'; '.join(parts)})"


def refusals(inp: dict[str, Any], limits: WorkerLimits) -> list[Refusal]:
    """What one worker's limits refuse in `inp`, in FIELDS order. Values of the wrong type are
    skipped: the worker names those itself."""
    out: list[Refusal] = []
    prompt = inp.get("prompt")
    if isinstance(prompt, str) and len(prompt) > limits.max_prompt_chars:
        out.append(Refusal("input.prompt", "above", f"{len(prompt)} characters", limits.max_prompt_chars))
    sides = {}
    for name, default in (("width", limits.default_width), ("height", limits.default_height)):
        value = inp.get(name)
        if value is None:
            sides[name] = default
        elif _is_int(value):
            sides[name] = value
            out += _side(f"input.{name}", value, limits)
    if len(sides) == 2 and (pixels := sides["width"] * sides["height"]) > limits.max_pixels:
        out.append(Refusal("input", "above", f"width x height = {pixels} pixels", limits.max_pixels))
    out += _within("input.steps", inp.get("steps"), limits.max_steps)
    fmt = inp.get("output_format")
    if isinstance(fmt, str) and fmt not in limits.output_formats:
        out.append(Refusal("input.output_format", "format", fmt, limits.output_formats))
    out += _within("input.num_images", inp.get("num_images"), limits.max_images)
    loras = inp.get("loras")
    if isinstance(loras, list) and len(loras) > limits.max_adapters:
        out.append(Refusal("input.loras", "above", f"{len(loras)} adapter(s)", limits.max_adapters))
    return out


def _within(field: str, value: Any, most: int) -> list[Refusal]:
    """A count that lies in [1, most]; not an integer: the worker's to name."""
    if not _is_int(value):
        return []
    if value > most:
        return [Refusal(field, "above", value, most)]
    return [Refusal(field, "below", value, 1)] if value < 1 else []


def _side(field: str, value: int, limits: WorkerLimits) -> list[Refusal]:
    out = [Refusal(field, "multiple", value, limits.size_multiple)] if value % limits.size_multiple else []
    if value > limits.max_side:
        out.append(Refusal(field, "above", value, limits.max_side))
    elif value < limits.min_side:
        out.append(Refusal(field, "below", value, limits.min_side))
    return out


def _everywhere(found: list[Refusal]) -> str:
    """One field every live worker refuses for the same reason, with the most any of them allows."""
    first = found[0]
    if first.kind == "above":
        return f"{first.field}: {first.value} is above every live worker's limit ({max(r.bound for r in found)})"
    if first.kind == "below":
        return f"{first.field}: {first.value} is below every live worker's minimum ({min(r.bound for r in found)})"
    if first.kind == "multiple":
        multiples = " or ".join(str(m) for m in sorted({r.bound for r in found}))
        return f"{first.field}: {first.value} is not a multiple of {multiples}, as every live worker requires"
    offered = sorted({f for r in found for f in r.bound})
    return f"{first.field}: {first.value!r} is not offered by any live worker (they offer {offered})"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
