"""Local result files the scheduler may touch (status page thumbnails, removal after retention):
only those under the roots the operator named (--results-root)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse


def local_path(uri: str, roots: tuple[Path, ...]) -> Path | None:
    """The file a file:// result URI names, resolved (so `..` and symlinks cannot leave the roots),
    when it lies under one of `roots`; None otherwise, and for gs:// or any other scheme."""
    if not uri.startswith("file://"):
        return None
    path = Path(unquote(urlparse(uri).path)).resolve()
    return path if any(path.is_relative_to(root) for root in roots) else None
