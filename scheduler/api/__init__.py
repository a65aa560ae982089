"""The reference scheduler's HTTP API, by resource: tasks, workers, reports, ops and status each hold
an APIRouter whose routes scheduler.app.create_app adds. Routes get what they use (a store role, the
settings, the metrics, the waits) as typed dependencies (deps.py); the store's errors become 404 and
409 in one place (errors.py)."""
