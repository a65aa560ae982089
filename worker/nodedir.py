"""The directory launch/node.sh shares with the ranks it starts (`dit-worker serve --node-dir DIR`).

torchrun restarts the whole group whenever a rank exits non-zero, and a signal sent while it does
so reaches no rank. Three files, each written once, carry what must outlive one group:

    stop      node.sh was told to stop: a rank started after it exits 0 at once, without registering
    fatal     a start error no restart can cure (config, device, port, refused token): its exit code
              on the first line, the message after. A rank started after it exits 0 at once, so
              torchrun ends after one restart and node.sh exits with the recorded code.
    drained   rank 0 drained cleanly: node.sh reports success even when torchrun itself was
              signalled (it then exits 1 whatever its ranks did)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Fatal:
    code: int
    message: str


class NodeDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def stop_requested(self) -> bool:
        return (self.path / "stop").exists()

    def fatal(self) -> Fatal | None:
        try:
            code, _, message = (self.path / "fatal").read_text().partition("\n")
        except FileNotFoundError:
            return None
        return Fatal(int(code), message.strip())

    def record_fatal(self, code: int, message: str) -> None:
        """The first rank to fail names the cause; later ones keep it (one line for node.sh to print)."""
        self._write_once("fatal", f"{code}\n{' '.join(message.split())}\n")

    def record_drained(self) -> None:
        self._write_once("drained", "")

    def _write_once(self, name: str, text: str) -> None:
        # Written aside and linked into place: node.sh never reads half a file, and the first writer wins.
        tmp = self.path / f".{name}.{os.getpid()}"
        tmp.write_text(text)
        try:
            os.link(tmp, self.path / name)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
