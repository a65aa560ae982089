"""Where adapters may come from (lora.allow, lora.registered) and their download from a real HTTP
server on 127.0.0.1 and the GCS emulator with the official client: bounded in size, every redirect
under an allowed prefix, each refusal naming the field."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.harness import Emulator
from tests.worker.adapters.conftest import lora_file
from worker.adapters import AdapterRefused, AdapterUnavailable, resolve
from worker.adapters.sources import fetch
from worker.config import LoraConfig

pytestmark = pytest.mark.integration  # an HTTP server in a thread, the GCS emulator (tests/tiers.py)

FIELD = "input.loras[0].source"


class Files(BaseHTTPRequestHandler):
    root: Path

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.startswith("/away/"):  # a redirect off the allowed prefix
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/elsewhere/a.safetensors")
            self.end_headers()
        elif self.path.startswith("/moved/"):  # a redirect to another allowed path
            self.send_response(302)
            self.send_header("Location", "/loras/a.safetensors")
            self.end_headers()
        elif self.path == "/loras/broken":
            self.send_response(503)
            self.end_headers()
        elif self.path == "/loras/endless":  # no Content-Length: counted as it streams
            self.send_response(200)
            self.end_headers()
            for _ in range(3):
                self.wfile.write(b"x" * (1 << 20))
        else:
            path = self.root / self.path.rsplit("/", 1)[-1]
            if not path.is_file():
                self.send_response(404)
                self.end_headers()
                return
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    lora_file(root / "a.safetensors")
    (root / "big.safetensors").write_bytes(b"y" * (3 << 20))
    handler = type("Handler", (Files,), {"root": root})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()


def cfg(server: str, **kw) -> LoraConfig:
    return LoraConfig(**{"allow": (f"{server}/loras/", f"{server}/moved/", f"{server}/away/"), "max_mb": 2, **kw})


def test_registered_names_and_allowed_urls_resolve_anything_else_is_refused(server):
    c = cfg(server, registered={"ghibli": "gs://styles/ghibli.safetensors"})
    assert resolve("ghibli", c, FIELD).url == "gs://styles/ghibli.safetensors"
    assert resolve(f"{server}/loras/a.safetensors", c, FIELD).url == f"{server}/loras/a.safetensors"
    assert resolve(f"{server.upper().replace('HTTP', 'http')}/loras/a.safetensors", c, FIELD).url.startswith(server)
    for source, why in [
        ("noir", "'noir' is neither a registered adapter (ghibli) nor a URL"),
        (f"{server}/other/a.safetensors", "is not under an allowed prefix"),
        (f"{server}/loras/../secrets/a.safetensors", "has . or .. segments"),
        (f"http://user:pw@{server.removeprefix('http://')}/loras/a.safetensors", "carries credentials"),
        ("file:///etc/passwd", "is not an https://, http:// or gs:// URL"),
        (f"{server}/lorasX/a.safetensors", "is not under an allowed prefix"),  # a prefix is whole segments
    ]:
        with pytest.raises(AdapterRefused) as e:
            resolve(source, c, FIELD)
        assert str(e.value).startswith(f"{FIELD}: ") and why in str(e.value), str(e.value)


def test_a_download_is_bounded_in_size_and_its_redirects_stay_allowed(server, tmp_path):
    c = cfg(server)
    fetch(resolve(f"{server}/loras/a.safetensors", c, FIELD), tmp_path / "a", c)
    assert (tmp_path / "a").read_bytes() == (lora_file(tmp_path / "ref.safetensors")).read_bytes()
    fetch(resolve(f"{server}/moved/x", c, FIELD), tmp_path / "m", c)  # to an allowed path: followed
    assert (tmp_path / "m").read_bytes() == (tmp_path / "a").read_bytes()
    for url, error, why in [
        (f"{server}/loras/big.safetensors", AdapterRefused, "3145728 bytes, above lora.max_mb (2 MiB)"),
        (f"{server}/loras/endless", AdapterRefused, "more than lora.max_mb (2 MiB)"),
        (f"{server}/loras/none.safetensors", AdapterRefused, "answered 404"),
        (f"{server}/away/x", AdapterRefused, "redirected to"),
        (f"{server}/loras/broken", AdapterUnavailable, "answered 503"),
    ]:
        with pytest.raises(error) as e:
            fetch(resolve(url, c, FIELD), tmp_path / "x", c)
        assert str(e.value).startswith(f"{FIELD}: ") and why in str(e.value), str(e.value)


def test_an_unreachable_host_is_unavailable_not_refused(tmp_path):
    c = LoraConfig(allow=("http://127.0.0.1:9/",), fetch_timeout_s=5)  # the discard port: nothing listens
    with pytest.raises(AdapterUnavailable, match="ConnectError"):
        fetch(resolve("http://127.0.0.1:9/a.safetensors", c, FIELD), tmp_path / "x", c)


def test_from_gcs_with_the_official_client(tmp_path, monkeypatch):
    emu = Emulator(tmp_path / "gcs")
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.url)
        emu.bucket("adapters").blob("flux/a.safetensors").upload_from_filename(
            str(lora_file(tmp_path / "a.safetensors")))
        c = LoraConfig(allow=("gs://adapters/flux/",))
        fetch(resolve("gs://adapters/flux/a.safetensors", c, FIELD), tmp_path / "got", c)
        assert (tmp_path / "got").read_bytes() == (tmp_path / "a.safetensors").read_bytes()
        with pytest.raises(AdapterRefused, match="does not exist"):
            fetch(resolve("gs://adapters/flux/none.safetensors", c, FIELD), tmp_path / "no", c)
    finally:
        emu.stop()
