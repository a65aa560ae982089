import pytest

from protocol import WorkerLimits
from worker.config import LimitsConfig, LoraConfig
from worker.serving.validation import InvalidRequest, advertised, validate_task

LIMITS = LimitsConfig(min_side=64, max_side=1024, max_pixels=1024 * 768, default_width=256,
                      default_height=256, max_prompt_chars=100)


def test_defaults_fill_missing_fields():
    job = validate_task("t1", {"prompt": "a cat"}, LIMITS)
    assert (job.width, job.height, job.steps, job.seed, job.output_format) == (256, 256, 4, None, "jpeg")


def test_several_images_take_consecutive_seeds():
    job = validate_task("t1", {"prompt": "a cat", "num_images": 3, "seed": 2**63 - 3}, LIMITS)
    assert job.num_images == 3 and job.seeds == (2**63 - 3, 2**63 - 2, 2**63 - 1)
    assert [(j.seed, j.num_images) for j in job.images()] == [(2**63 - 3, 1), (2**63 - 2, 1), (2**63 - 1, 1)]
    assert validate_task("t1", {"prompt": "a cat"}, LIMITS).num_images == 1


def test_full_request():
    job = validate_task("t1", {"prompt": "a cat", "width": 512, "height": 320, "steps": 2, "seed": 9,
                               "output_format": "png"}, LIMITS)
    assert (job.width, job.height, job.steps, job.seed) == (512, 320, 2, 9)


@pytest.mark.parametrize("raw, reason", [
    ({"prompt": ""}, "prompt: must not be empty"),
    ({"prompt": "   "}, "prompt: must not be empty"),
    ({"prompt": "x" * 101}, "prompt: 101 characters, the limit is 100"),
    ({"prompt": "a\x00b"}, "NUL"),
    ({"prompt": "a \u202ecat"}, "prompt: contains U+202E (RIGHT-TO-LEFT OVERRIDE), a bidirectional control"),
    ({"prompt": "a \u2066cat"}, "prompt: contains U+2066 (LEFT-TO-RIGHT ISOLATE)"),
    ({"prompt": 42}, "prompt: Input should be a valid string"),
    ({}, "prompt: required"),
    ({"prompt": "x", "width": 100}, "width: 100 is not a multiple of 16"),
    ({"prompt": "x", "height": 2048}, "height: 2048 is outside [64, 1024]"),
    ({"prompt": "x", "width": 32}, "width: 32 is outside"),
    ({"prompt": "x", "width": 1024, "height": 1024}, "exceeds 786432"),
    ({"prompt": "x", "width": "256"}, "width: Input should be a valid integer"),
    ({"prompt": "x", "width": 256.0}, "width: Input should be a valid integer"),
    ({"prompt": "x", "steps": True}, "steps: Input should be a valid integer"),
    ({"prompt": "x", "steps": 0}, "steps: 0 is outside [1, 8]"),
    ({"prompt": "x", "steps": 9}, "steps: 9 is outside"),
    ({"prompt": "x", "seed": -1}, "seed: Input should be greater than or equal to 0"),
    ({"prompt": "x", "seed": 2**63}, "seed: Input should be less than or equal to"),
    ({"prompt": "x", "output_format": "gif"}, "output_format: 'gif' is not one of ['jpeg', 'webp', 'png']"),
    ({"prompt": "x", "colour": "red"}, "colour: unknown field"),
    ({"prompt": "x", "num_images": 0}, "num_images: 0 is outside [1, 4]"),
    ({"prompt": "x", "num_images": 5}, "num_images: 5 is outside [1, 4]"),
    ({"prompt": "x", "num_images": "2"}, "num_images: Input should be a valid integer"),
    ({"prompt": "x", "num_images": 2.0}, "num_images: Input should be a valid integer"),
    ({"prompt": "x", "num_images": 3, "seed": 2**63 - 2}, "seed: 9223372036854775806 + num_images - 1 exceeds"),
])
def test_refusals_name_the_field(raw, reason):
    with pytest.raises(InvalidRequest) as e:
        validate_task("t1", raw, LIMITS)
    assert reason in str(e.value)


def test_several_problems_are_reported_together():
    with pytest.raises(InvalidRequest) as e:
        validate_task("t1", {"prompt": 1, "width": "x", "extra": 0}, LIMITS)
    assert "prompt:" in str(e.value) and "width:" in str(e.value) and "extra: unknown field" in str(e.value)


@pytest.mark.parametrize("raw", [None, [], "prompt", 3])
def test_input_must_be_an_object(raw):
    with pytest.raises(InvalidRequest, match="input must be a JSON object"):
        validate_task("t1", raw, LIMITS)


@pytest.mark.parametrize("task_id", ["../etc/passwd", "", ".hidden", "a/b", "x" * 129])
def test_task_ids_must_be_safe_object_names(task_id):
    with pytest.raises(InvalidRequest, match="task id"):
        validate_task(task_id, {"prompt": "x"}, LIMITS)


def test_a_direction_mark_is_allowed():
    assert validate_task("t1", {"prompt": "\u05d7\u05ea\u05d5\u05dc\u200f 3"}, LIMITS).prompt.endswith("3")


def test_the_limits_advertised_are_the_ones_validation_applies():
    assert advertised(LIMITS) == WorkerLimits(max_prompt_chars=100, min_side=64, max_side=1024, size_multiple=16,
                                              max_pixels=1024 * 768, default_width=256, default_height=256,
                                              max_steps=8, output_formats=["jpeg", "webp", "png"], max_images=4,
                                              max_adapters=0)


LORA = LoraConfig(allow=("https://hub.example/loras/",), registered={"ink": "gs://adapters/ink.safetensors"},
                  max_adapters=2)


def test_adapters_resolve_to_their_urls_with_scales_and_hashes():
    job = validate_task("t1", {"prompt": "x", "loras": [
        {"source": "ink"}, {"source": "https://HUB.example/loras/a.safetensors", "scale": 0.5, "sha256": "a" * 64}]},
        LIMITS, LORA)
    assert [(r.source, r.scale, r.sha256, r.field) for r in job.loras] == [
        ("gs://adapters/ink.safetensors", 1.0, None, "input.loras[0].source"),
        ("https://hub.example/loras/a.safetensors", 0.5, "a" * 64, "input.loras[1].source")]
    assert job.adapter_set == (("gs://adapters/ink.safetensors", 1.0), ("a" * 64, 0.5))
    assert advertised(LIMITS, LORA).max_adapters == 2 and advertised(LIMITS).max_adapters == 0


@pytest.mark.parametrize("loras, reason", [
    ([{"source": "ink"}] * 3, "loras: 3 adapters, the limit is 2"),
    ([{"source": "ink", "scale": 5}], "loras[0].scale: 5 is outside [-4.0, 4.0]"),
    ([{"source": "ink", "scale": "1"}], "loras.0.scale"),
    ([{"source": "ink", "sha256": "XYZ"}], "loras.0.sha256"),
    ([{"source": "ink", "weight": 1}], "weight: unknown field"),
    ([{"source": "noir"}], "loras[0].source: 'noir' is neither a registered adapter (ink) nor a URL"),
    ([{"source": "https://evil.example/a.safetensors"}], "loras[0].source: https://evil.example/a.safetensors is not under"),
    ([{"source": "https://hub.example/loras/../x"}], "has . or .. segments"),
])
def test_adapter_refusals_name_the_field(loras, reason):
    with pytest.raises(InvalidRequest) as e:
        validate_task("t1", {"prompt": "x", "loras": loras}, LIMITS, LORA)
    assert reason in str(e.value)


def test_a_worker_with_no_adapter_source_takes_none():
    with pytest.raises(InvalidRequest, match=r"loras: this worker takes no adapters \(no lora.allow or lora.registered\)"):
        validate_task("t1", {"prompt": "x", "loras": [{"source": "ink"}]}, LIMITS)
    assert validate_task("t1", {"prompt": "x", "loras": []}, LIMITS).loras == ()
