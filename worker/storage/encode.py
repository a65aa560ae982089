"""Image encoding. Deterministic: the same pixels and settings always give the same bytes."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from worker.config import EncodeConfig

CONTENT_TYPES = {"png": "image/png", "webp": "image/webp", "jpeg": "image/jpeg"}


def encode_image(pixels: np.ndarray, fmt: str, cfg: EncodeConfig = EncodeConfig()) -> tuple[bytes, str]:
    if fmt not in CONTENT_TYPES:
        raise ValueError(f"unsupported output format {fmt!r}")
    buf = io.BytesIO()
    img = Image.fromarray(pixels)
    if fmt == "png":
        img.save(buf, format="PNG", compress_level=cfg.png_compress_level)
    elif fmt == "webp":
        img.save(buf, format="WEBP", quality=cfg.webp_quality, method=cfg.webp_method)
    else:
        img.save(buf, format="JPEG", quality=cfg.jpeg_quality, optimize=False)
    return buf.getvalue(), CONTENT_TYPES[fmt]
