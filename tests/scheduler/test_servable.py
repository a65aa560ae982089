"""Whether any live worker could serve an input, from the limits workers advertise (scheduler/servable.py).
The refusals over HTTP are in test_servable_failures.py."""

from __future__ import annotations

import pytest

from protocol import WorkerLimits
from scheduler.servable import refusal


def limits(**kw) -> WorkerLimits:
    base = dict(max_prompt_chars=2000, min_side=64, max_side=1024, max_pixels=1024 * 1024, default_width=256,
                default_height=256, max_steps=8, output_formats=["png", "webp"])
    return WorkerLimits(**{**base, **kw})


SMALL, BIG = limits(), limits(max_side=2048, max_pixels=2048 * 2048, max_steps=4, output_formats=["png", "jpeg"])


@pytest.mark.parametrize("inp", [
    {"prompt": "a cat"},
    {"prompt": "a cat", "width": 1024, "height": 1024, "steps": 8, "output_format": "webp"},
    {"prompt": "a cat", "width": 2048, "steps": 4},  # only BIG, and BIG allows it all
    {"prompt": "a cat", "output_format": "jpeg"},
])
def test_an_input_some_live_worker_accepts_passes(inp):
    assert refusal(inp, [SMALL, BIG]) is None


@pytest.mark.parametrize("inp", [
    {"prompt": 7, "width": "1360", "steps": True, "output_format": 1},  # types: the worker names them
    {"prompt": "a fox", "colour": "red"},  # unknown fields too
    {"width": 512},
])
def test_what_only_the_worker_can_judge_passes(inp):
    assert refusal(inp, [SMALL]) is None


def test_nothing_is_refused_without_a_live_worker_or_when_one_did_not_say():
    huge = {"prompt": "x", "width": 99999}
    assert refusal(huge, []) is None  # the fleet may start later
    assert refusal(huge, [SMALL, None]) is None  # a worker without limits may serve anything


@pytest.mark.parametrize("inp, why", [
    ({"prompt": "x", "width": 1360}, "input.width: 1360 is above every live worker's limit (1024)"),
    ({"prompt": "x", "height": 32}, "input.height: 32 is below every live worker's minimum (64)"),
    ({"prompt": "x", "width": 100}, "input.width: 100 is not a multiple of 16, as every live worker requires"),
    ({"prompt": "x" * 2001}, "input.prompt: 2001 characters is above every live worker's limit (2000)"),
    ({"prompt": "x", "steps": 9}, "input.steps: 9 is above every live worker's limit (8)"),
    ({"prompt": "x", "steps": 0}, "input.steps: 0 is below every live worker's minimum (1)"),
    ({"prompt": "x", "output_format": "gif"}, "input.output_format: 'gif' is not offered by any live worker "
                                              "(they offer ['png', 'webp'])"),
])
def test_a_refusal_names_the_field_and_the_limit(inp, why):
    assert refusal(inp, [SMALL]) == why


def test_every_refused_value_is_named_at_once_not_one_per_try():
    why = refusal({"prompt": "x" * 2001, "width": 1370, "height": 32, "steps": 9}, [SMALL])
    assert why == ("input.prompt: 2001 characters is above every live worker's limit (2000); "
                   "input.width: 1370 is not a multiple of 16, as every live worker requires; "
                   "input.width: 1370 is above every live worker's limit (1024); "
                   "input.height: 32 is below every live worker's minimum (64); "
                   "input.steps: 9 is above every live worker's limit (8)")


def test_pixels_count_the_default_side_an_input_leaves_out():
    wide = limits(max_pixels=1024 * 768, default_height=1024)
    assert refusal({"prompt": "x", "width": 1024, "height": 768}, [wide]) is None
    assert refusal({"prompt": "x", "width": 1024}, [wide]) == \
        "input: width x height = 1048576 pixels is above every live worker's limit (786432)"


def test_the_limit_named_is_the_most_any_live_worker_allows():
    assert refusal({"prompt": "x", "width": 4096}, [SMALL, BIG]) == \
        "input.width: 4096 is above every live worker's limit (2048)"
    assert refusal({"prompt": "x", "output_format": "gif"}, [SMALL, BIG]) == \
        "input.output_format: 'gif' is not offered by any live worker (they offer ['jpeg', 'png', 'webp'])"


def test_an_input_each_worker_refuses_another_part_of_is_refused_naming_both():
    # 2048 wide: only BIG; 8 steps: only SMALL.
    assert refusal({"prompt": "x", "width": 2048, "steps": 8}, [SMALL, BIG]) == (
        "input: no live worker accepts all of it (input.steps: 8 is above 4; input.width: 2048 is above 1024)")


def test_images_beyond_every_live_worker_are_refused_and_one_that_makes_them_serves():
    four = limits(max_images=4)
    assert refusal({"prompt": "a cat", "num_images": 2}, [SMALL]) == (
        "input.num_images: 2 is above every live worker's limit (1)")  # SMALL predates num_images
    assert refusal({"prompt": "a cat", "num_images": 4}, [SMALL, four]) is None
    assert refusal({"prompt": "a cat", "num_images": 0}, [four]) == (
        "input.num_images: 0 is below every live worker's minimum (1)")
    assert refusal({"prompt": "a cat", "num_images": "4"}, [SMALL]) is None  # a type: the worker names it
