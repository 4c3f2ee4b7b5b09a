"""The small, permissively licensed data sets berth ships (their sources and licenses: SOURCES.md beside them).

In the repository they are `data/samples/`; `tasks/samples` links to that folder, so a wheel carries them as package
data and `berth build-defaults` works outside a checkout too.
"""

from __future__ import annotations

from pathlib import Path

SAMPLES = Path(__file__).resolve().parent / "samples"
