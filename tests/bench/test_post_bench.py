"""`make bench-post`: photographs at the worker's sizes, and every encoder a config can choose, with
the worker's default marked from its config rather than written down."""

from __future__ import annotations

from bench import post as post_bench
from worker.config import LimitsConfig


def test_photographs_are_cropped_to_the_size_asked():
    photos = post_bench.photographs(96, 64)
    assert set(photos) == set(post_bench.PHOTOS)
    assert all(p.shape == (64, 96, 3) and p.dtype.name == "uint8" for p in photos.values())


def test_each_size_has_every_candidate_and_exactly_one_default_in_the_configs_format():
    rows = post_bench.encoder_rows([(96, 64), (64, 64)], repeats=1)
    for size in ("96x64", "64x64"):
        mine = [r for r in rows if r["size"] == size]
        assert [r["encoder"] for r in mine] == [c[0] for c in post_bench.CANDIDATES]
        (default,) = [r for r in mine if r["default"]]
        assert default["format"] == LimitsConfig().output_formats[0]
    png1 = next(r for r in rows if r["encoder"] == "png level 1" and r["size"] == "96x64")
    assert png1["noise"]["kb_p50"] > png1["photo"]["kb_p50"]  # noise is the worst case for PNG
