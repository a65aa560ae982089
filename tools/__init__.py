"""Tools around the worker, never imported by it: the benchmarks, the tiny test model, random-weight
safety models. `dit-worker bench` and `dit-worker make-tiny-model` reach them as plug-in commands."""
