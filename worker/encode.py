"""Image encoding. Deterministic: the same pixels always give the same bytes."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

CONTENT_TYPES = {"png": "image/png"}


def encode_image(pixels: np.ndarray, fmt: str) -> tuple[bytes, str]:
    if fmt not in CONTENT_TYPES:
        raise ValueError(f"unsupported output format {fmt!r}")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue(), CONTENT_TYPES[fmt]
