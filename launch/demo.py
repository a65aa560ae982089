"""`make demo`: the whole system on this machine, on the embedded default (tiny model, CPU).

Builds the tiny model if absent, starts the reference scheduler, submits a handful of prompts, runs a
2-rank worker under torchrun, waits for every task, prints a table and stops what it started.
Paths are relative to the current folder (a checkout, or any folder holding configs/tiny.toml when
dit-worker is installed from a wheel). Images are left in var/demo/images. One prompt is unsafe on purpose (in Italian): the prompt policy must refuse
it before any inference. Exit code 0 only if every other task succeeded with a JPEG (the default format) of the requested
size and that one failed as unsafe_prompt.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from PIL import Image

from client.api import Client
from launch.local import free_port, start_scheduler, start_worker, wait_until
from protocol import FINAL_STATUSES, TaskView

PROMPTS = [
    ("a lighthouse on a cliff at dawn", 256, 256),
    ("a red fox in fresh snow, watercolour", 384, 256),
    ("an astronaut riding a horse on the moon", 256, 384),
    ("a bowl of ramen, studio lighting", 512, 512),
    ("a cathedral made of glass", 320, 192),
    ("a tiny robot reading a book", 256, 256),
    ("una donna nuda sulla spiaggia, foto", 256, 256),  # refused by the prompt policy: never reaches the model
]
EXPECT_REFUSED = {"una donna nuda sulla spiaggia, foto"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("var/demo"))
    p.add_argument("--config", type=Path, default=Path("configs/tiny.toml"))
    p.add_argument("--model", type=Path, default=Path("models/tiny-flux"), help="built here if absent")
    p.add_argument("--timeout", type=float, default=240.0)
    args = p.parse_args(argv)
    if not args.config.is_file():
        p.error(f"--config: {args.config} not found (run from a checkout, or name the file)")
    here = Path.cwd()
    model, out = args.model.resolve(), args.out.resolve()
    if not (model / "model_index.json").exists():
        from launch.tiny_model import make_tiny_model

        print(f"building the tiny random-weight model in {model}")
        make_tiny_model(model)
    shutil.rmtree(out, ignore_errors=True)
    images = out / "images"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    print(f"scheduler on {url} (status page: {url}/status while the demo runs); logs in {out}")
    scheduler = start_scheduler(out / "scheduler.db", port, out / "scheduler.log",
                                extra=["--api-results-roots", str(images)], cwd=here)
    worker = None
    client = Client(url)
    try:
        tasks = [client.submit(text, width=w, height=h, seed=i) for i, (text, w, h) in enumerate(PROMPTS)]
        print(f"submitted {len(tasks)} tasks; starting a {args.nproc}-rank worker under torchrun")
        worker = start_worker(args.config.resolve(), args.nproc, out / "worker.log",
                              overrides=[f"queue.url={url}", f"storage.local.root={images}",
                                         f"model.source={model}", "ops.host=127.0.0.1", "ops.port=0"], cwd=here)
        t0 = time.monotonic()
        done = _ended(client, [t.id for t in tasks], args.timeout, worker)
        print(f"all tasks finished in {time.monotonic() - t0:.1f}s after the worker started")
        for line in worker.messages().splitlines():  # which checks ran, as the worker chose them
            if "safety checks:" in line or "safety.text.backend = auto" in line:
                print(line)
        print()
        ok = _print_table(done, here)
    finally:
        client.close()
        if worker is not None:
            worker.stop()
        scheduler.stop()
    print(f"\n{'OK' if ok else 'FAILED'}: images in {images}")
    return 0 if ok else 1


def _ended(client: Client, ids: list[str], timeout: float, worker) -> dict[str, TaskView]:
    """Every task once it has ended, asked one at a time (the first not yet ended); the worker's
    exit ends the wait at once, with its log's last lines."""
    ended: dict[str, TaskView] = {}

    def all_ended() -> bool:
        for task_id in ids:
            if task_id not in ended:
                if (t := client.get(task_id)).status not in FINAL_STATUSES:
                    return False
                ended[task_id] = t
        return True

    wait_until(all_ended, timeout, f"{len(ids)} task(s)", worker, every_s=0.2)
    return {task_id: ended[task_id] for task_id in ids}


def _print_table(done: dict[str, TaskView], here: Path) -> bool:
    ok = True
    # waited: submit to start of generation (includes the worker's start-up); ran: start to result.
    print(f"{'task':<10} {'status':<10} {'waited s':>8} {'ran s':>6}  {'size':<9} image")
    for task_id, t in done.items():
        want = (t.input["width"], t.input["height"])
        finished = t.finished_at or time.time()
        started = t.started_at or finished  # never started: refused before generation
        waited, ran = started - t.created_at, finished - started
        where, size = "-", "-"
        if t.status == "succeeded":
            path = Path(urlparse(t.result.uri).path)
            with Image.open(path) as img:
                size = f"{img.width}x{img.height}"
                ok &= img.size == want and img.format == "JPEG"  # the default output format
            where = str(path.relative_to(here)) if path.is_relative_to(here) else str(path)
        else:
            where = f"{t.error.code}: {t.error.message}"
        refused = t.input["prompt"] in EXPECT_REFUSED
        if refused:
            ok &= t.status == "failed" and t.error.code == "unsafe_prompt"
        elif t.status != "succeeded":
            ok = False
        print(f"{task_id[:8]:<10} {t.status:<10} {waited:8.2f} {ran:6.2f}  {size:<9} {where}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
