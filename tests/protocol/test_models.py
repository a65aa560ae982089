import pytest
from pydantic import ValidationError

from protocol import (BIDI_CONTROLS, ErrorEnvelope, Heartbeat, LeaseRequest, RegisterWorker, Report, SubmitTask,
                      TaskResult, WorkerLimits)

RESULT = TaskResult(uri="file:///x.png", content_type="image/png", width=16, height=16, seed=1, bytes=3,
                    sha256="ab")


def test_succeeded_report_needs_result():
    with pytest.raises(ValidationError, match="needs a result"):
        Report(worker_id="w", lease_token="t", status="succeeded")


def test_failed_report_needs_error():
    with pytest.raises(ValidationError, match="needs an error"):
        Report(worker_id="w", lease_token="t", status="failed")


def test_processing_report_cannot_carry_result():
    with pytest.raises(ValidationError, match="cannot carry a result"):
        Report(worker_id="w", lease_token="t", status="processing", result=RESULT)


def test_valid_reports():
    Report(worker_id="w", lease_token="t", status="processing")
    Report(worker_id="w", lease_token="t", status="succeeded", result=RESULT)
    Report(worker_id="w", lease_token="t", status="failed",
           error=ErrorEnvelope(code="x", message="y", retryable=False))


def test_submit_refuses_unknown_top_level_fields_but_keeps_input_free_form():
    with pytest.raises(ValidationError, match="extra"):
        SubmitTask.model_validate({"input": {}, "colour": "red"})
    # beyond its prompt, the input is validated by the worker, against its own limits
    inp = {"prompt": "a fox", "anything": [1]}
    assert SubmitTask.model_validate({"input": inp}).input == inp


@pytest.mark.parametrize("inp, why", [
    ({}, "input.prompt: required, a string"),
    ({"prompt": ""}, "input.prompt: must not be empty"),
    ({"prompt": " \n\t"}, "input.prompt: must not be empty"),
    ({"prompt": ["a fox"]}, "input.prompt: must be a string, not list"),
    ({"prompt": 7}, "input.prompt: must be a string, not int"),
])
def test_a_task_without_a_prompt_is_refused_at_submit_naming_it(inp, why):
    with pytest.raises(ValidationError, match=why):
        SubmitTask.model_validate({"input": inp})


def test_result_keeps_fields_from_newer_workers():
    r = TaskResult.model_validate({**RESULT.model_dump(), "signed_url": "https://x"})
    assert r.model_dump()["signed_url"] == "https://x"


@pytest.mark.parametrize("body", [{"max_tasks": 0}, {"max_tasks": 1, "wait_s": 61}, {"wait_s": -1}])
def test_lease_request_bounds(body):
    with pytest.raises(ValidationError):
        LeaseRequest.model_validate(body)


@pytest.mark.parametrize("code", [*range(0x202A, 0x202F), *range(0x2066, 0x206A)])
def test_a_prompt_with_a_bidirectional_control_is_refused_naming_the_field_and_the_code_point(code):
    with pytest.raises(ValidationError, match=f"input.prompt: contains U\\+{code:04X} \\("):
        SubmitTask.model_validate({"input": {"prompt": f"abc{chr(code)}def"}})
    assert len(BIDI_CONTROLS) == 9


@pytest.mark.parametrize("mark", ["\u200e", "\u200f", "\u061c"])
def test_direction_marks_are_allowed_in_prompts(mark):
    assert SubmitTask.model_validate({"input": {"prompt": f"\u05e9\u05dc\u05d5\u05dd{mark}!"}})


def test_a_worker_may_advertise_its_limits_and_say_it_drained():
    base = {"hostname": "h", "world_size": 1, "devices": [], "model": "m", "version": "v"}
    assert RegisterWorker.model_validate(base).limits is None  # older workers send none
    limits = {"max_prompt_chars": 2000, "min_side": 64, "max_side": 1024, "max_pixels": 1 << 20,
              "default_width": 256, "default_height": 256, "max_steps": 8, "output_formats": ["png"]}
    assert RegisterWorker.model_validate({**base, "limits": limits}).limits == WorkerLimits(**limits, size_multiple=16)
    with pytest.raises(ValidationError):
        WorkerLimits.model_validate({**limits, "max_side": 0})
    assert Heartbeat(status="drained", timestamp=0).status == "drained"


BODIES = [
    '{"input": {"prompt": "a cat"}}'.encode(),
    '{"input": {"prompt": "un chat \\u00e9t\\u00e9, 😀"}}'.encode(),
    '\ufeff{"input": {"prompt": "after a byte order mark"}}'.encode(),  # json.loads reads past it
    '{"input": {"prompt": "a pair \\ud83d\\ude00"}}'.encode(),  # escaped, but a whole character
    b'{"input": {"prompt": "lone \\ud83d"}}',
    b'{"input": {"prompt": "lone \\uDFFF low"}}',
    b'{"input": {"x": ["nested", {"deeper": "\\udc00"}], "prompt": "p"}}',
    b'{"input": {"prompt": "encoded \xed\xa0\x80 surrogate"}}',  # not UTF-8: json.loads passes it
    b'{"input": {"prompt": "an escaped backslash \\\\ud800 is text"}}',
    '{"input": {"prompt": "utf-16"}}'.encode("utf-16"),
    b'{"input": {"prompt": 5}}',
    b'{"input": {"prompt": "x"}, "unknown": 1}',
]


@pytest.mark.parametrize("body", BODIES)
def test_parse_body_gives_what_model_validate_gives(body):
    import json

    from protocol import parse_body

    def outcome(fn):
        try:
            return fn().model_dump()
        except ValidationError as e:
            return [(err["loc"], err["msg"]) for err in e.errors()]

    want = outcome(lambda: SubmitTask.model_validate(json.loads(body)))
    assert outcome(lambda: parse_body(SubmitTask, body)) == want


def test_parse_body_still_refuses_a_lone_surrogate_in_a_nested_model():
    from protocol import Exchange, parse_body

    body = (b'{"exchange_id": "x", "reports": [{"task_id": "t", "worker_id": "w", "lease_token": "k",'
            b' "status": "failed", "error": {"code": "internal", "message": "bad \\udc00", "retryable": false}}]}')
    with pytest.raises(ValidationError, match="lone surrogate"):
        parse_body(Exchange, body)


def test_a_model_read_back_from_the_store_is_validated_as_any_other_but_its_text_not_walked_again():
    from protocol import TaskView, stored

    row = {"id": "t1", "status": "queued", "input": {"prompt": "a lighthouse"}, "priority": 0, "attempts": 0,
           "max_attempts": 3, "created_at": 1.0, "updated_at": 1.0, "idempotency_key": None, "worker_id": None,
           "result": None, "error": None, "started_at": None, "finished_at": None}
    assert stored(TaskView, row) == TaskView(**row)
    with pytest.raises(ValidationError):
        stored(TaskView, {**row, "attempts": "many"})
    with pytest.raises(ValidationError):  # what comes in is walked: a lone surrogate is refused there
        TaskView(**{**row, "input": {"prompt": "\ud800"}})
    assert stored(TaskView, {**row, "input": {"prompt": "\ud800"}}).input == {"prompt": "\ud800"}
