"""`make bench-lora`'s parts that need no timing to be right: the cache's hit rate under the mixed
load (a budget that holds every file fetches each once; a smaller one fetches more), the loads each
holder makes, and the full-size arithmetic."""

from __future__ import annotations

from bench import lora


def test_the_cache_and_the_holders_under_a_mixed_load(tiny_model, tmp_path):
    setup = lora.Setup(model=str(tiny_model), rank=8)
    files = lora.adapters(setup, tmp_path, 4)
    out = lora.part_cache(setup, files, tasks=40, budgets=(1, 64))
    small, large = out["disk"]["1 MiB"], out["disk"]["64 MiB"]
    assert large["fetches"] == len({f.sha256 for f in files}) or large["fetches"] <= len(files)
    assert large["hit rate"] == round(1 - large["fetches"] / out["adapters_asked"], 3)
    assert small["fetches"] >= large["fetches"]
    assert 0 < out["held"]["3 slots"]["loads"] <= out["adapters_asked"]
    assert out["held"]["by name, keep 8"]["loads"] == large["fetches"]  # 4 files: all stay loaded


def test_slots_on_the_full_size_transformer_are_counted_from_its_shapes():
    out = lora.part_full_size((16,))
    assert out["linear layers"] > 400 and 11 < out["their parameters (G)"] < 13
    assert 0.005 < out["per slot"]["rank 16"]["share of linear multiply-adds"] < 0.01
