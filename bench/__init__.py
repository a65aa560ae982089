"""The benchmarks, run from a checkout and never imported by the product: one entry point,
`python -m bench NAME [ARGS]` (the `make bench-*` targets call it; `python -m bench` lists them)."""
