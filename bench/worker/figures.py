"""The benchmark's arithmetic: FLOP per image, per-phase figures, ratios, percentiles."""

from __future__ import annotations

import statistics

from worker.config import WorkerConfig


def transformer_flop(tc: dict, width: int, height: int, text_tokens: int, steps: int) -> float:
    """FLOP of the FLUX transformer for one image: per block and token, the linear layers do 12 d^2
    multiply-adds (double blocks: QKV 3, out 1, MLP 8 per stream; single blocks: fused in 7, out 5),
    attention 2 L d per token (QK^T and AV). Embedders, T5, CLIP and the VAE are left out."""
    d = tc["num_attention_heads"] * tc["attention_head_dim"]
    blocks = tc["num_layers"] + tc["num_single_layers"]
    tokens = text_tokens + (width // 16) * (height // 16)
    per_block = 2 * (12 * d * d * tokens + 2 * tokens * tokens * d)
    return float(blocks * per_block * steps)


def transformer_config(cfg: WorkerConfig) -> dict:
    if cfg.model.random_arch != "none":
        from worker.model.architectures import ARCHS

        return ARCHS[cfg.model.random_arch]["transformer"]
    from diffusers import FluxTransformer2DModel

    return dict(FluxTransformer2DModel.load_config(cfg.model.source, subfolder="transformer",
                                                   revision=cfg.model.revision))


def phase(n: int, seconds: float, latencies: list[float], stages: dict, peak_mb: float) -> dict:
    return {"images": n, "seconds": round(seconds, 3), "images_per_min": round(60 * n / seconds, 2),
            "latency_ms": percentiles(latencies), "stages_ms_per_image": {k: round(v, 2) for k, v in stages.items()},
            "peak_memory_mb": round(peak_mb)}


def with_tflops(phase: dict, flops: float) -> dict:
    # Four significant digits, not four decimals: the tiny model on a loaded CPU makes under 5e-5
    # TFLOP/s, which rounded to 0.0 and read as "no work done".
    phase["tflops"] = float(f"{flops * phase['images'] / phase['seconds'] / 1e12:.4g}")
    return phase


def ratios(entry: dict) -> dict:
    ips = {k: entry[k]["images_per_min"] for k in ("baseline", "optimised", "worker") if k in entry}
    out = {}
    if "baseline" in ips and "optimised" in ips:
        out["optimised_over_baseline"] = round(ips["optimised"] / ips["baseline"], 3)
    if "worker" in ips and "optimised" in ips:
        # Time per image, worker / bare optimised: the target is <= 1.05.
        out["worker_time_over_optimised"] = round(ips["optimised"] / ips["worker"], 3)
    if "worker" in ips and "baseline" in ips:
        out["worker_over_baseline"] = round(ips["worker"] / ips["baseline"], 3)
    return out


def per_image(result: dict) -> dict:
    """A task's stage times; stages shared by a batch are divided among its images."""
    shared = {"embed", "denoise", "vae", "gather", "broadcast", "generate"}
    n = result.get("batch_size", 1) or 1
    return {k: (v / n if k in shared else v) for k, v in result.get("timings_ms", {}).items()}


def mean(rows: list[dict]) -> dict:
    keys = {k for r in rows for k in r}
    return {k: statistics.fmean(r.get(k, 0.0) for r in rows) for k in sorted(keys)}


def percentiles(seconds: list[float]) -> dict:
    ms = sorted(s * 1e3 for s in seconds)
    return {"p50": round(statistics.median(ms), 1), "p95": round(ms[round(0.95 * (len(ms) - 1))], 1)}
