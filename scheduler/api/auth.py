"""Who may call what: bearer tokens for workers and clients, and for the status page a client token
as a browser's Basic auth password. Empty token sets switch a check off; __main__ allows that only on
a loopback address."""

from __future__ import annotations

import base64
import contextlib
import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from scheduler.api.deps import services_of

_bearer = HTTPBearer(auto_error=False)
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _bearer_checker(*tokens_of: str):
    async def check(request: Request, cred: Bearer) -> None:
        secrets = services_of(request).secrets  # not a dependency of its own: one fewer to solve per call
        tokens: frozenset[str] = frozenset().union(*(getattr(secrets, t) for t in tokens_of))
        if not admits(tokens, cred.credentials if cred else None):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong bearer token",
                                headers={"WWW-Authenticate": "Bearer"})

    return check


worker_auth = _bearer_checker("worker_tokens")
client_auth = _bearer_checker("client_tokens")
reader_auth = _bearer_checker("worker_tokens", "client_tokens")  # either may read the workers list


async def page_auth(request: Request) -> None:
    """The status page, for browsers: a client token as the password of HTTP Basic auth (the browser
    asks for it) or as a bearer token. Open when client auth is off (loopback only)."""
    tokens = services_of(request).secrets.client_tokens
    if not tokens:
        return
    given = ""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        given = value
    elif scheme.lower() == "basic":
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            given = base64.b64decode(value, validate=True).decode().partition(":")[2]
    if not given or not _known(given, tokens):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "a client token is needed (any user name, the token "
                            "as password)", headers={"WWW-Authenticate": 'Basic realm="dit-scheduler"'})


def admits(tokens: frozenset[str], credentials: str | None) -> bool:
    """Whether a bearer token is one of `tokens` (none: auth is off)."""
    return not tokens or (credentials is not None and _known(credentials, tokens))


def bearer_credentials(authorization: str | None) -> str | None:
    """A bearer token as FastAPI's HTTPBearer reads it from the Authorization header, for the hot
    path (scheduler/api/hot.py), which must admit exactly whom the routes' checks admit."""
    scheme, credentials = get_authorization_scheme_param(authorization)
    if not (authorization and scheme and credentials) or scheme.lower() != "bearer":
        return None
    return credentials


def _known(given: str, tokens: frozenset[str]) -> bool:
    return any(hmac.compare_digest(given, t) for t in tokens)
