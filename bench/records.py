"""Reading and writing a run record of bench/results, as text or compressed (`.json.gz`: bench/results/README.md)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def read_record(path: Path) -> Any:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as stream:
            return json.load(stream)
    return json.loads(path.read_text(encoding="utf-8"))


def write_record(path: Path, result: Any) -> None:
    """The record as indented JSON text, its folder made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
