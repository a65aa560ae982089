"""A route's answer as bytes: status, JSON body, headers. The calls a fleet makes per task return one,
so FastAPI (a Response) and the hot path (raw ASGI, scheduler/api/hot.py) send the same bytes, and
neither validates a model the route has just built (FastAPI's response_model does, some 50 us a
task view); the route's response_model still documents it."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel
from starlette.responses import Response

JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes = b""  # empty: no body and no content type (204)
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, model: BaseModel, status: int = 200, headers: tuple[tuple[str, str], ...] = ()) -> Answer:
        return cls(status, model.model_dump_json().encode(), headers)

    def response(self) -> Response:
        """For a FastAPI route."""
        return Response(self.body or None, self.status, dict(self.headers), JSON if self.body else None)

    async def send(self, send) -> None:
        """For raw ASGI: the headers a Response would send."""
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers]
        if self.body:
            headers += [(b"content-length", str(len(self.body)).encode()), (b"content-type", JSON.encode())]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})
