"""Errors as clients and workers see them, mapped once for the whole app: the store's Unknown is a
404 and its Refused (Cancelled too) a 409, each with the store's message as `detail` (the worker
reads a cancel from a 409's detail); a request that does not validate is a 422 naming each field."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from scheduler.store import Refused, Unknown

STATUS_OF: dict[type[Exception], int] = {Unknown: 404, Refused: 409}  # subclasses (Cancelled) by their base


def install(app: FastAPI) -> None:
    for error in STATUS_OF:
        app.add_exception_handler(error, store_error)
    app.add_exception_handler(RequestValidationError, validation_error)


def status_of(error: Exception) -> int:
    return next(code for kind, code in STATUS_OF.items() if isinstance(error, kind))


async def store_error(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=status_of(exc))


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming each field and what is wrong, without echoing the input: a NaN, an infinity or a
    huge value sent back would make the answer itself fail. Every field wrong is named at once, and a
    validator's own words without pydantic's "Value error, " before them."""
    errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "").removeprefix("Value error, "),
               "type": e.get("type", "")} for e in exc.errors()]
    return JSONResponse({"detail": errors}, status_code=422)
