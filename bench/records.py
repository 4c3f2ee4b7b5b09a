"""Reading a run record of bench/results, kept as text or compressed (`.json.gz`: bench/results/README.md)."""

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
