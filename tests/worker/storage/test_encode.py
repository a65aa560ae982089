"""Encoding: each allowed format decodes to the same size, and the same pixels give the same bytes."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from worker.config import EncodeConfig
from worker.storage.encode import encode_image

PIXELS = np.random.default_rng(0).integers(0, 256, (48, 80, 3), dtype=np.uint8)


@pytest.mark.parametrize("fmt, pil, ctype", [("png", "PNG", "image/png"), ("webp", "WEBP", "image/webp"),
                                             ("jpeg", "JPEG", "image/jpeg")])
def test_formats_decode_to_the_same_size_and_are_deterministic(fmt, pil, ctype):
    data, content_type = encode_image(PIXELS, fmt)
    assert content_type == ctype and encode_image(PIXELS, fmt)[0] == data
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == pil and img.size == (80, 48)


def test_png_is_lossless_and_quality_settings_apply():
    data, _ = encode_image(PIXELS, "png")
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), PIXELS)
    low = encode_image(PIXELS, "jpeg", EncodeConfig(jpeg_quality=10))[0]
    high = encode_image(PIXELS, "jpeg", EncodeConfig(jpeg_quality=95))[0]
    assert len(low) < len(high)


def test_unknown_format():
    with pytest.raises(ValueError, match="unsupported output format 'gif'"):
        encode_image(PIXELS, "gif")
