"""The scheduler's status page in headless Chromium (Debian's package, driven by Playwright) during
a run with a one-rank worker: a worker, the queue depth, thumbnails, failures, a refresh in place, and
not one console error or failed request.

    DIT_SCREENSHOT=var/status.png pytest tests/e2e/test_status_page.py   # keeps the screenshot there
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil
import pytest

from tests.harness import Stack, ready_worker

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)

CHROMIUM = "/usr/bin/chromium"
# Chromium on a machine without internet: no background connections, no sandbox as root.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make install` installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()


def test_the_status_page_shows_workers_queue_thumbnails_and_failures(tmp_path, tiny_model, browser):
    images = tmp_path / "images"
    stack = Stack(tmp_path, tiny_model, scheduler_args=["--api-results-roots", str(images)])
    try:
        queued_ids = [stack.client.submit({"prompt": f"a lighthouse, study {i}", "width": 256, "height": 256},
                                          priority=i % 2)["id"] for i in range(3)]
        queued_ids.append(stack.client.submit({"prompt": "x", "width": 100})["id"])  # fails: invalid_request
        stack.proc = stack.worker(nproc=1)
        ready_worker(stack, stack.proc)
        stack.client.wait(queued_ids, 120, proc=stack.proc)
        # Work waiting while the page is open: the worker is frozen (SIGSTOP, every process of it),
        # so new tasks stay queued, but for those its long poll, already at the scheduler, takes
        # (at most its lease-ahead of 4). It is listed as ready until the liveness time passes.
        frozen = freeze(stack.proc.pid)
        for _ in range(10):
            stack.client.submit({"prompt": "waits in the queue"}, priority=5)
        depth = stack.client.http.get("/v1/queue").json()["queued_by_priority"]["5"]
        assert depth >= 6
        problems: list[str] = []
        page = browser.new_page(viewport={"width": 1100, "height": 1000})
        page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} {r.failure}"))
        page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
        page.goto(f"{stack.url}/status", wait_until="networkidle")

        assert page.locator("#workers tr.worker").count() == 1
        row = page.locator("#workers tr.worker").first.inner_text()
        assert "ready" in row and "1 \u00d7 cpu" in row
        assert page.locator("#queued b").inner_text() == str(depth)
        assert "priority 5" in page.locator("section.tiles").inner_text()
        thumbs = page.locator("#results img")
        assert thumbs.count() == 3
        widths = page.eval_on_selector_all("#results img", "imgs => imgs.map(i => i.complete && i.naturalWidth)")
        assert all(w and w > 0 for w in widths), widths  # every thumbnail loaded and decoded
        assert "invalid_request" in page.locator("#failures").inner_text()
        assert page.locator("#throughput rect").count() >= 1  # succeeded tasks in this minute's bar

        # The page refreshes itself in place: the section is replaced by a fresh copy.
        page.evaluate("document.getElementById('status').dataset.old = '1'")
        page.wait_for_function("!document.getElementById('status').dataset.old", timeout=15_000)
        shot = tmp_path / "status.png"
        page.screenshot(path=str(shot), full_page=True)
        if keep := os.environ.get("DIT_SCREENSHOT"):
            Path(keep).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, keep)
        assert shot.stat().st_size > 10_000
        assert problems == []
        page.close()
        thaw(frozen)
    finally:
        stack.close()


def freeze(pid: int) -> list:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in procs:
        p.suspend()
    return procs


def thaw(procs: list) -> None:
    for p in procs:
        p.resume()
