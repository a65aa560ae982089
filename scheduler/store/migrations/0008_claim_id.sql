-- The exchange (POST /v1/workers/{wid}/exchange) that claimed a task's current lease, as its worker
-- named it: a retry of that exchange is answered the same leases rather than claiming more. NULL for
-- a lease call's claims. Found through tasks_worker (a worker's held tasks), so no index of its own.
ALTER TABLE tasks ADD COLUMN claim_id TEXT;
