"""A queue client as a user would write one, for the benchmarks and the tests."""

from __future__ import annotations

import httpx

from launch.local import Proc, wait_until


class PlainClient:
    """A queue client as a user would write one (raw HTTP, dicts: submit, poll), for the benchmarks and
    the tests, beside the product's own (client.api.Client)."""

    def __init__(self, url: str, token: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=10.0)

    def submit(self, input: dict, **kw) -> dict:
        resp = self.http.post("/v1/tasks", json={"input": input, **kw})
        resp.raise_for_status()
        return resp.json()

    def task(self, task_id: str) -> dict:
        resp = self.http.get(f"/v1/tasks/{task_id}")
        resp.raise_for_status()
        return resp.json()

    def wait(self, task_ids: list[str], timeout: float, until=("succeeded", "failed"),
             proc: Proc | None = None) -> dict[str, dict]:
        """Polls until every task reaches a status in `until`; fails early if `proc` dies. One task
        is asked at a time, the first not yet done, so a long wait costs the scheduler one request
        per poll rather than one per task (which, on a small machine, slowed the worker measured)."""
        seen: dict[str, dict] = {}
        left = list(task_ids)

        def done() -> dict[str, dict] | None:
            while left:
                seen[left[0]] = self.task(left[0])
                if seen[left[0]]["status"] not in until:
                    return None
                left.pop(0)
            return {t: seen[t] for t in task_ids}  # final statuses do not change

        try:
            return wait_until(done, timeout, f"{len(task_ids)} task(s)", proc)
        except TimeoutError:
            raise TimeoutError(f"tasks not done after {timeout}s: {({t: v['status'] for t, v in seen.items()})}") from None
