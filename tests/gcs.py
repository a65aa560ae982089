"""A real GCS emulator on 127.0.0.1, driven by the official google-cloud-storage client."""

from __future__ import annotations

import os
from pathlib import Path

from launch.local import Proc, free_port, start_gcs_emulator


class Emulator:
    def __init__(self, log_dir: Path, persistent: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.root = log_dir / "gcs-data" if persistent else None  # objects survive a restart
        self.proc: Proc | None = None
        self.start()

    def start(self) -> None:
        if self.root:
            self.root.mkdir(parents=True, exist_ok=True)
        self.proc = start_gcs_emulator(self.port, self.log_dir / "gcs.log", self.root)

    def stop(self) -> None:
        if self.proc and self.proc.alive():
            self.proc.kill()

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        os.environ["STORAGE_EMULATOR_HOST"] = self.url  # read by the client when it is built
        return storage.Client(project="test", credentials=AnonymousCredentials())

    def bucket(self, name: str):
        client = self.client()
        bucket = client.bucket(name)
        if not bucket.exists():
            client.create_bucket(name)
        return client.bucket(name)
