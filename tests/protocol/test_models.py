import pytest
from pydantic import ValidationError

from protocol import ErrorEnvelope, LeaseRequest, Report, SubmitTask, TaskResult

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
    # the input is validated by the worker, against its own limits
    assert SubmitTask.model_validate({"input": {"anything": [1]}}).input == {"anything": [1]}


def test_result_keeps_fields_from_newer_workers():
    r = TaskResult.model_validate({**RESULT.model_dump(), "signed_url": "https://x"})
    assert r.model_dump()["signed_url"] == "https://x"


@pytest.mark.parametrize("body", [{"max_tasks": 0}, {"max_tasks": 1, "wait_s": 61}, {"wait_s": -1}])
def test_lease_request_bounds(body):
    with pytest.raises(ValidationError):
        LeaseRequest.model_validate(body)
