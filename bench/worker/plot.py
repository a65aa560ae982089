"""The benchmark's figure: images/min per phase and size, and where the worker's time goes."""

from __future__ import annotations

from pathlib import Path


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on a server
    import matplotlib.pyplot as plt

    sizes = list(report["sizes"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = [n for n in ("baseline", "optimised", "worker") if any(n in report["sizes"][s] for s in sizes)]
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        values = [report["sizes"][s].get(name, {}).get("images_per_min", 0) for s in sizes]
        left.bar([x + i * width for x in range(len(sizes))], values, width, label=name)
    left.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(sizes))], sizes)
    left.set_ylabel("images / min")
    left.set_title(f"{report['model']} on {report['device']}", fontsize=9)
    left.legend()
    worker = {s: report["sizes"][s].get("worker", {}).get("stages_ms_per_image", {}) for s in sizes}
    stages = ["lease", "text_check", "admit", "broadcast", "embed", "denoise", "vae", "gather", "image_check",
              "encode", "store", "report"]
    bottom = [0.0] * len(sizes)
    for i, stage in enumerate(stages):
        values = [worker[s].get(stage, 0.0) for s in sizes]
        right.bar(range(len(sizes)), values, bottom=bottom, label=stage, color=plt.cm.tab20(i))
        bottom = [b + v for b, v in zip(bottom, values)]
    right.set_xticks(range(len(sizes)), sizes)
    right.set_ylabel("ms per image (worker, summed stages)")
    right.set_title("where the worker's time goes (stages overlap in time)", fontsize=9)
    right.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
