"""Where a benchmark's figures go: one JSON file, its folder made, its path said."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save(path: Path, report: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(f"written to {path}")
