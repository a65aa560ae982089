"""The Python client of the queue protocol (httpx, tenacity, the protocol's own models), sync and
async, and the `dit` command built on it (client/cli.py).

    from client import Client
    with Client("http://scheduler:8700", token="...") as dit:
        task = dit.submit("a lighthouse at dawn", width=1360, height=768, wait_s=60)
        dit.download(task, "out.png")     # or dit.download(task_id, ...) to resume later
        recent = dit.list_tasks(status="failed", limit=20)
"""

from client.api import AsyncClient, Client, image_path
from client.errors import (
    AuthError,
    ClientError,
    Conflict,
    DownloadFailed,
    InvalidRequest,
    RateLimited,
    TaskFailed,
    TaskNotEnded,
    TaskNotFound,
    Unavailable,
)

__all__ = ["AsyncClient", "AuthError", "Client", "ClientError", "Conflict", "DownloadFailed", "InvalidRequest",
           "RateLimited", "TaskFailed", "TaskNotEnded", "TaskNotFound", "Unavailable", "image_path"]
