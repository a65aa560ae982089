"""ASGI middleware: 413 for a request body over the limit, before anything parses it."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class BodyLimit:
    """413 for a request body over `max_bytes`, by its Content-Length or, when chunked, as it
    arrives."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = _content_length(scope["headers"])
        if length is not None:
            if not length.isdigit() or int(length) > self.max_bytes:
                return await self._too_large(scope, receive, send)
            # The server delivers no more than the length declared (uvicorn reads what follows as
            # the next request): nothing to count as it arrives.
            return await self.app(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._too_large(scope, receive, send)

    async def _too_large(self, scope, receive, send) -> None:
        resp = JSONResponse({"detail": f"request body over {self.max_bytes} bytes"}, status_code=413)
        await resp(scope, receive, send)


def _content_length(headers) -> bytes | None:
    for key, value in headers:
        if key == b"content-length":
            return value
    return None


class _TooLarge(BaseException):
    """A BaseException: FastAPI turns any Exception raised while reading a body into a 400."""
