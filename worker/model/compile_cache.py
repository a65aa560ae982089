"""A compile cache on the node's disk (`speed.compile_cache_dir`), so a worker restarted on a node
that has compiled before skips most of its warm-up.

Inductor keeps its caches (FX graphs, AOTAutograd, generated kernels, autotuning results) in one
folder, TORCHINDUCTOR_CACHE_DIR. Here that folder is named after everything compiled code depends
on: torch, Triton, Python, the device. A node whose torch or GPU changed finds no folder of its own,
says what the cache holds instead, and compiles cold; it never loads code built for something else.
Each fingerprint's folder records when it was made and last used; the three most recently used are
kept.

A damaged cache (a file half-written when the node lost power, a full disk) can make a compile fail
(seen here: a corrupt kernel library gave a C++ compile error). `set_aside` moves the folder away and
empties torch's in-memory caches; the engine then compiles cold, once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

KEEP = 3  # fingerprints kept: a node that switches back and forth does not recompile each time
META = "fingerprint.json"
ASIDE = ".set-aside-"


def compile_errors() -> tuple[type[BaseException], ...]:
    """What a failed compile raises: dynamo wraps the backend's error; some torch versions raise
    Inductor's own."""
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor import exc

    inductor = getattr(exc, "InductorError", None)
    return (BackendCompilerFailed,) + ((inductor,) if inductor else ())


def fingerprint(device: torch.device) -> dict[str, str]:
    """What compiled code depends on, beyond the model itself (Inductor keys that by graph)."""
    fp = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine()}
    try:
        import triton

        fp["triton"] = triton.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        fp.update(device=torch.cuda.get_device_name(device), capability=f"sm{major}{minor}",
                  cuda=str(torch.version.cuda))
    else:
        fp.update(device="cpu", capability=torch.backends.cpu.get_cpu_capability())
    return fp


def describe(fp: dict[str, str]) -> str:
    return f"torch {fp.get('torch', '?')} on {fp.get('device', '?')} ({fp.get('capability', '?')})"


def folder_name(fp: dict[str, str]) -> str:
    """Readable, and unique: the readable part loses characters, the digest does not."""
    words = "-".join(fp.get(k, "") for k in ("torch", "device", "capability"))
    digest = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:10]
    return f"{re.sub(r'[^a-z0-9.]+', '-', words.lower()).strip('-')}-{digest}"


@dataclass
class CompileCache:
    root: Path
    folder: Path
    fingerprint: dict[str, str]
    _inode: int = 0

    @classmethod
    def open(cls, root: str | Path, device: torch.device, fp: dict[str, str] | None = None) -> "CompileCache | None":
        """Points Inductor at this fingerprint's folder under `root`. Returns None (and torch keeps
        its default, a per-user temporary folder) when `root` cannot be written."""
        root, fp = Path(root), fp or fingerprint(device)
        folder = root / folder_name(fp)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            warm = (folder / META).exists()
            _write_meta(folder, fp)
        except OSError as e:
            log.warning("speed.compile_cache_dir: cannot write to %s (%s); compiling without a persistent cache",
                        root, e.strerror or e)
            return None
        cache = cls(root, folder, fp, folder.stat().st_ino)
        if warm:
            log.info("compile cache: reusing %s for %s", folder, describe(fp))
        elif others := cache.others():
            log.warning("compile cache: nothing for %s in %s, which holds %s: compiling cold", describe(fp), root,
                        "; ".join(others))
        else:
            log.info("compile cache: empty for %s; compiling cold into %s", describe(fp), folder)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)  # read by Inductor at each compile
        cache.prune()
        return cache

    def others(self) -> list[str]:
        """What the root holds for other torch versions or devices, as people read it."""
        out = []
        for meta in sorted(self.root.glob(f"*/{META}")):
            if meta.parent != self.folder and ASIDE not in meta.parent.name:
                try:
                    out.append(describe(json.loads(meta.read_text())["fingerprint"]))
                except (OSError, ValueError, KeyError):
                    out.append(f"{meta.parent.name} (unreadable)")
        return out

    def set_aside(self, error: BaseException) -> None:
        """The cache made a compile fail: move it away, forget what torch loaded from it, start
        empty. Several ranks may get here at once; only the first moves the folder."""
        aside = self.folder.with_name(f"{self.folder.name}{ASIDE}{int(time.time())}-{os.getpid()}")
        try:
            if self.folder.stat().st_ino == self._inode:
                self.folder.rename(aside)
                log.warning("compile cache: a compile failed with the cache in use (%s); set it aside as %s and "
                            "compiling cold", _headline(error), aside)
        except OSError as e:  # another rank moved it first, or the disk is read-only now
            log.warning("compile cache: could not set %s aside (%s); compiling cold", self.folder, e)
        self.folder.mkdir(parents=True, exist_ok=True)
        _write_meta(self.folder, self.fingerprint)
        self._inode = self.folder.stat().st_ino
        torch._dynamo.reset()  # compiled frames, guards
        from torch._inductor.utils import clear_caches

        clear_caches()  # Inductor's in-memory copies of what it read from the folder

    def prune(self) -> None:
        """Keeps the KEEP most recently used fingerprints and the newest folder set aside. Only
        folders this made (they hold its META) are touched: the root may be shared."""
        ours = [p.parent for p in self.root.glob(f"*/{META}")]
        used = sorted((p for p in ours if ASIDE not in p.name), key=_last_used, reverse=True)
        aside = sorted((p for p in ours if ASIDE in p.name), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in used[KEEP:] + aside[1:]:
            if old != self.folder:
                shutil.rmtree(old, ignore_errors=True)
                log.info("compile cache: removed %s", old)

    @staticmethod
    def stats() -> dict[str, int]:
        """Graphs this process took from the cache and compiled, so far (Inductor's counters)."""
        from torch._dynamo.utils import counters

        return {"hits": int(counters["inductor"]["fxgraph_cache_hit"]),
                "misses": int(counters["inductor"]["fxgraph_cache_miss"])}


def _headline(error: BaseException) -> str:
    """The line that names what failed: dynamo's message starts "backend='inductor' raised:" and
    puts the cause on the next line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {' '.join(lines[:2])[:300]}"


def _write_meta(folder: Path, fp: dict[str, str]) -> None:
    meta = folder / META
    try:
        created = json.loads(meta.read_text())["created"]
    except (OSError, ValueError, KeyError):
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    tmp = folder / f".{META}.{os.getpid()}"
    tmp.write_text(json.dumps({"fingerprint": fp, "created": created, "host": socket.gethostname(),
                               "last_used": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2))
    os.replace(tmp, meta)  # several ranks write it at once


def _last_used(folder: Path) -> float:
    try:
        return (folder / META).stat().st_mtime
    except OSError:
        return 0.0
