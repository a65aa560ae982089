"""The status page's parts in process: the last hour's chart from the store's history, the page's
content, its thumbnails. The browser test is tests/e2e/test_status_page.py."""

from __future__ import annotations

from fastapi.testclient import TestClient
from PIL import Image

from protocol import SubmitTask
from scheduler.app import create_app
from scheduler.config import ApiConfig, ResultsConfig
from scheduler.status_page import build_chart
from tests.harness import REG

RESULT = {"content_type": "image/png", "width": 256, "height": 256, "seed": 1, "bytes": 1, "sha256": "0"}


def finish(http, wid: str, status: str, **payload) -> str:
    task = http.post("/v1/tasks", json={"input": {"prompt": "a <script>lighthouse</script>"}}).json()
    lease = http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1}).json()["leases"][0]
    assert lease["task_id"] == task["id"]
    assert http.post(f"/v1/tasks/{task['id']}/report", json={
        "worker_id": wid, "lease_token": lease["lease_token"], "status": status, **payload}).status_code == 200
    return task["id"]


def test_the_chart_stacks_outcomes_per_minute_and_weights_the_mean_latency():
    rows = [{"bucket": 59, "status": "succeeded", "n": 3, "mean_s": 2.0, "max_s": 3.0},
            {"bucket": 59, "status": "failed", "n": 1, "mean_s": 9.0, "max_s": 9.0},
            {"bucket": 10, "status": "succeeded", "n": 1, "mean_s": 6.0, "max_s": 6.0},
            {"bucket": 60, "status": "succeeded", "n": 1, "mean_s": 2.0, "max_s": 2.0}]  # boundary: last bucket
    chart = build_chart(rows)
    assert (chart.total_succeeded, chart.total_failed, chart.peak_per_min) == (5, 1, 5)
    x, width, ok, bad = chart.bars[59]
    assert (ok, bad) == (80 * 4 / 5, 80 * 1 / 5) and x == 590.0
    assert chart.mean_latency_s == round((3 * 2 + 6 + 2) / 5, 2) and chart.peak_latency_s == 6.0
    assert len(chart.line.split()) == 2  # two minutes had successes
    empty = build_chart([])
    assert empty.line == "" and empty.total_succeeded == 0 and all(b[2] == 0 for b in empty.bars)


def test_the_page_lists_workers_results_and_failures_escaped(make_store, tmp_path):
    Image.new("RGB", (256, 256), (30, 120, 200)).save(tmp_path / "ok.png")
    store = make_store()
    with TestClient(create_app(store, ApiConfig(results=ResultsConfig(roots=(tmp_path.resolve(),))))) as http:
        wid = http.post("/v1/workers", json={**REG, "devices": [{"name": "H100", "memory_bytes": 1}] * 2}).json()["worker_id"]
        ok = finish(http, wid, "succeeded", result={**RESULT, "uri": f"file://{tmp_path}/ok.png"})
        signed = finish(http, wid, "succeeded", result={**RESULT, "uri": "gs://b/x.png",
                                                          "url": "https://storage.googleapis.com/b/x.png?X-Goog-Signature=1"})
        finish(http, wid, "failed", error={"code": "unsafe_image", "message": "image refused: <nudity>", "retryable": False})
        http.post("/v1/tasks", json={"input": {"prompt": "waiting"}, "priority": 3})
        page = http.get("/status")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        html = page.text
        assert wid in html and "2 \u00d7 H100" in html and "priority 3" in html
        assert f'src="/status/thumbs/{ok}.png"' in html
        assert 'src="https://storage.googleapis.com/b/x.png?X-Goog-Signature=1"' in html and signed
        assert "unsafe_image" in html and "&lt;nudity&gt;" in html and "<nudity>" not in html
        assert "1 (not retried)" in html  # a refusal no retry can cure does not read "1/3"
        assert "<script>lighthouse" not in html  # prompts are escaped
        assert "http://" not in html.replace(f"http://{REG['hostname']}", "")  # nothing loaded from elsewhere
        thumb = http.get(f"/status/thumbs/{ok}.png")
        assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/png"
        with Image.open(__import__("io").BytesIO(thumb.content)) as img:
            assert img.size == (160, 160)


def test_one_gather_serves_every_viewer_for_a_moment(make_store):
    store = make_store()
    calls = []
    history = store.tasks.history
    store.tasks.history = lambda *a: calls.append(a) or history(*a)
    with TestClient(create_app(store, ApiConfig(status_cache_s=60))) as http:
        for _ in range(5):
            assert http.get("/status").status_code == 200
    assert len(calls) == 1
    with TestClient(create_app(store, ApiConfig(status_cache_s=0))) as http:
        for _ in range(3):
            http.get("/status")
    assert len(calls) == 4


def test_a_drained_worker_is_shown_neutrally_and_a_lost_one_red(make_store, clock):
    store = make_store(liveness_s=5.0)
    with TestClient(create_app(store, ApiConfig(status_cache_s=0, sweep_interval_s=3600))) as http:
        left, crashed = (http.post("/v1/workers", json=REG).json()["worker_id"] for _ in range(2))
        http.post(f"/v1/workers/{left}/heartbeat", json={"status": "drained", "timestamp": 0})
        clock.now += 6
        store.upkeep.sweep()
        rows = {w: row for row in http.get("/status").text.split('<tr class="worker">')[1:]
                for w in (left, crashed) if w in row}
        assert '<td class="muted">drained</td>' in rows[left]
        assert '<td class="bad">lost</td>' in rows[crashed]


def test_a_node_restarted_again_and_again_is_one_row_not_one_per_registration(make_store, clock):
    store = make_store()
    with TestClient(create_app(store, ApiConfig(status_cache_s=0, sweep_interval_s=3600))) as http:
        other = http.post("/v1/workers", json={**REG, "hostname": "other-host"}).json()["worker_id"]
        http.post(f"/v1/workers/{other}/heartbeat", json={"status": "drained", "timestamp": 0})
        ids = []
        for _ in range(5):  # drained by Ctrl-C, started again: a new registration each time
            clock.now += 1
            ids.append(http.post("/v1/workers", json=REG).json()["worker_id"])
            http.post(f"/v1/workers/{ids[-1]}/heartbeat", json={"status": "drained", "timestamp": 0})
        clock.now += 1
        live = http.post("/v1/workers", json=REG).json()["worker_id"]
        html = http.get("/status").text
        rows = html.split('<tr class="worker">')[1:]
        assert len(rows) == 2 and live in rows[0] + rows[1] and other in rows[0] + rows[1]  # the host that left stays
        assert not any(i in html for i in ids)
        assert "5 earlier registration(s) of these workers" in html


def test_in_flight_is_shown_against_the_most_the_worker_may_hold(make_store):
    with TestClient(create_app(make_store(), ApiConfig(status_cache_s=0))) as http:
        wid = http.post("/v1/workers", json=REG).json()["worker_id"]
        # Two rounds waiting (lease_ahead 4) and two generating or unreported (max_pending 4): six
        # held is within what it may hold, eight, not "6 / 4".
        http.post(f"/v1/workers/{wid}/heartbeat", json={"status": "ready", "timestamp": 0,
                                                        "in_flight": [f"t{i}" for i in range(6)],
                                                        "counters": {"lease_ahead": 4, "max_pending": 4}})
        assert '<td class="num">6 / 8</td>' in http.get("/status").text
        http.post(f"/v1/workers/{wid}/heartbeat", json={"status": "ready", "timestamp": 0, "in_flight": ["t1"]})
        assert '<td class="num">1</td>' in http.get("/status").text  # no bounds heard of: the count alone


def test_user_text_is_isolated_so_a_stored_override_cannot_flip_the_page(make_store):
    store = make_store()
    with TestClient(create_app(store, ApiConfig(status_cache_s=0))) as http:
        wid = http.post("/v1/workers", json={**REG, "hostname": "node\u202e7"}).json()["worker_id"]
        # Stored before submissions refused bidirectional controls: it bypasses today's validation.
        store.tasks.submit(SubmitTask.model_construct(input={"prompt": "a cat \u202eon a mat"}, priority=0,
                                                      idempotency_key=None, max_attempts=None, webhook=None))
        lease = http.post(f"/v1/workers/{wid}/lease", json={"max_tasks": 1}).json()["leases"][0]
        http.post(f"/v1/tasks/{lease['task_id']}/report", json={
            "worker_id": wid, "lease_token": lease["lease_token"], "status": "succeeded",
            "result": {**RESULT, "uri": "gs://b/x.png"}})
        html = http.get("/status").text
        assert "<figcaption><bdi>a cat \u202eon a mat</bdi>" in html
        assert "<td><bdi>node\u202e7</bdi></td>" in html
