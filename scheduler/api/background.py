"""What runs beside the requests while the app serves: the sweeper (expired leases, silent workers,
retention), webhook delivery, and wake-ups from other scheduler processes. No request does these."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.concurrency import run_in_threadpool

from scheduler.api.services import Services
from scheduler.config import ApiConfig
from scheduler.results import local_path
from scheduler.webhooks import Dispatcher

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def running(s: Services) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(sweep_forever(s))]
    if s.api.webhooks.allow:  # off the request path: a slow receiver delays only its own calls
        dispatcher = Dispatcher(s.store, s.secrets.webhook_secret, max_age_s=s.api.webhooks.max_age_s,
                                metrics=s.metrics)
        tasks.append(asyncio.create_task(dispatcher.run()))
    if listen := getattr(s.store, "listen", None):  # other scheduler processes' new work (PostgreSQL)
        loop = asyncio.get_running_loop()
        listen(lambda n: loop.call_soon_threadsafe(s.waiters.notify, n))
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()


async def sweep_forever(s: Services) -> None:
    while True:
        await asyncio.sleep(s.api.sweep_interval_s)
        try:
            if moved := await s.store.acall(s.store.upkeep.sweep):
                s.waiters.notify(moved)
            if expired := await s.store.acall(s.store.upkeep.purge):
                await run_in_threadpool(remove_results, expired, s.api)
        except Exception:  # a locked or broken DB must not end the sweeper
            log.exception("lease sweep failed")


def remove_results(uris: list[str], api: ApiConfig) -> None:
    """Expired tasks' local result files, when the operator asked for it, and only under the results
    roots. Objects in GCS are left to the bucket's lifecycle rule (docs/deploy.md)."""
    if not api.results.remove_expired:
        return
    for uri in uris:
        if (path := local_path(uri, api.results.roots)) is not None:
            path.unlink(missing_ok=True)
