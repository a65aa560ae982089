"""Where an adapter comes from: a URL under one of the operator's prefixes (lora.allow) or a name it
registered (lora.registered), and the download itself, bounded in bytes and time. Every refusal
names the task's field; what a retry may cure (a host down, a timeout) is AdapterUnavailable."""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from worker.config import LoraConfig


class AdapterRefused(ValueError):
    """This adapter cannot serve this task, and no retry would change that: str(e) names the field."""


class AdapterUnavailable(RuntimeError):
    """It could not be fetched now (unreachable, timed out, 5xx); another attempt may succeed."""


@dataclass(frozen=True)
class Source:
    url: str  # http(s):// or gs://, as fetched
    field: str  # the task's field that named it, for errors: input.loras[1].source


def resolve(source: str, cfg: LoraConfig, field: str) -> Source:
    """The URL a task's `source` stands for, if the operator allows it."""
    if source in cfg.registered:
        return Source(cfg.registered[source], field)
    if "://" not in source:
        known = ", ".join(sorted(cfg.registered)) or "none are registered"
        raise AdapterRefused(f"{field}: {source!r} is neither a registered adapter ({known}) nor a URL")
    url = normal(source, field)
    if not allowed(url, cfg.allow):
        raise AdapterRefused(f"{field}: {url} is not under an allowed prefix (lora.allow: "
                             f"{', '.join(cfg.allow) or 'none'})")
    return Source(url, field)


def normal(url: str, field: str) -> str:
    """`url` with its path normalised; refused when it carries credentials or dot segments."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http", "gs") or not parts.netloc:
        raise AdapterRefused(f"{field}: {url!r} is not an https://, http:// or gs:// URL")
    if "@" in parts.netloc or parts.fragment:
        raise AdapterRefused(f"{field}: {url!r} carries credentials or a fragment")
    if any(segment in (".", "..") for segment in parts.path.split("/")):
        raise AdapterRefused(f"{field}: {url!r} has . or .. segments")
    path = posixpath.normpath(parts.path) if parts.path else "/"
    return f"{parts.scheme}://{parts.netloc.lower()}{path}" + (f"?{parts.query}" if parts.query else "")


def allowed(url: str, prefixes: tuple[str, ...]) -> bool:
    """Whether normalised `url` lies under one of the prefixes (their hosts compared in lower case)."""
    return any(url.startswith(_host_lower(prefix)) for prefix in prefixes)


def _host_lower(prefix: str) -> str:
    scheme, _, rest = prefix.partition("://")
    host, _, path = rest.partition("/")
    return f"{scheme}://{host.lower()}/{path}"


def fetch(source: Source, dest: Path, cfg: LoraConfig) -> None:
    """Downloads `source` to `dest`, at most lora.max_mb, within lora.fetch_timeout_s."""
    limit = cfg.max_mb << 20
    deadline = time.monotonic() + cfg.fetch_timeout_s
    if source.url.startswith("gs://"):
        _from_gcs(source, dest, limit, cfg.fetch_timeout_s)
    else:
        _from_http(source, dest, limit, deadline, cfg.allow)


def _from_http(source: Source, dest: Path, limit: int, deadline: float, prefixes: tuple[str, ...]) -> None:
    def each_hop(request: httpx.Request) -> None:  # a redirect lands under an allowed prefix too
        url = str(request.url)
        if url != source.url and not allowed(normal(url, source.field), prefixes):
            raise AdapterRefused(f"{source.field}: redirected to {url}, which is not under an allowed prefix")

    left = max(deadline - time.monotonic(), 0.1)
    try:
        with httpx.Client(follow_redirects=True, timeout=httpx.Timeout(min(left, 30.0)), max_redirects=5,
                          event_hooks={"request": [each_hop]}) as http, \
                http.stream("GET", source.url) as resp:
            if resp.status_code in (404, 403, 401, 410):
                raise AdapterRefused(f"{source.field}: {source.url} answered {resp.status_code}")
            if resp.status_code != 200:
                raise AdapterUnavailable(f"{source.field}: {source.url} answered {resp.status_code}")
            length = resp.headers.get("content-length")
            if length and length.isdigit() and int(length) > limit:
                raise AdapterRefused(f"{source.field}: {int(length)} bytes, above lora.max_mb ({limit >> 20} MiB)")
            got = 0
            with open(dest, "wb") as f:
                for chunk in resp.iter_bytes(1 << 20):
                    got += len(chunk)
                    if got > limit:
                        raise AdapterRefused(f"{source.field}: more than lora.max_mb ({limit >> 20} MiB)")
                    if time.monotonic() > deadline:
                        raise AdapterUnavailable(f"{source.field}: the download took longer than "
                                                 "lora.fetch_timeout_s")
                    f.write(chunk)
    except httpx.TooManyRedirects:
        raise AdapterRefused(f"{source.field}: {source.url} redirects too often") from None
    except httpx.HTTPError as e:
        raise AdapterUnavailable(f"{source.field}: {source.url}: {type(e).__name__}: {e}") from None


def _from_gcs(source: Source, dest: Path, limit: int, timeout_s: float) -> None:
    from google.api_core import exceptions as gx
    from google.cloud import storage  # the worker's own GCS client (STORAGE_EMULATOR_HOST honoured)

    bucket, _, name = source.url.removeprefix("gs://").partition("/")
    try:
        blob = storage.Client().bucket(bucket).get_blob(name, timeout=timeout_s)
        if blob is None:
            raise AdapterRefused(f"{source.field}: {source.url} does not exist")
        if blob.size is not None and blob.size > limit:
            raise AdapterRefused(f"{source.field}: {blob.size} bytes, above lora.max_mb ({limit >> 20} MiB)")
        blob.download_to_filename(str(dest), timeout=timeout_s)
        if dest.stat().st_size > limit:  # replaced meanwhile by a larger object
            raise AdapterRefused(f"{source.field}: more than lora.max_mb ({limit >> 20} MiB)")
    except (gx.Forbidden, gx.Unauthorized, gx.NotFound) as e:
        raise AdapterRefused(f"{source.field}: {source.url}: {e.message}") from None
    except AdapterRefused:
        raise
    except Exception as e:  # unreachable, 5xx, no credentials now
        raise AdapterUnavailable(f"{source.field}: {source.url}: {type(e).__name__}: {e}") from None
