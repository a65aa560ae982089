from scheduler import leases


def test_deadline_is_now_plus_ttl():
    assert leases.deadline(100.0, 30.0) == 130.0


def test_expiry_requeues_until_attempts_are_used():
    assert leases.after_expiry(attempts=1, max_attempts=3) == "queued"
    assert leases.after_expiry(attempts=2, max_attempts=3) == "queued"
    assert leases.after_expiry(attempts=3, max_attempts=3) == "failed"


def test_failure_requeues_only_when_retryable_and_attempts_left():
    assert leases.after_failure(True, 1, 3) == "queued"
    assert leases.after_failure(True, 3, 3) == "failed"
    assert leases.after_failure(False, 1, 3) == "failed"
