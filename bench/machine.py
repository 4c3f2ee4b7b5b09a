"""The machine facts every benchmark writes beside its numbers, so a result can be rerun and compared.

Library versions are read from the installed distributions' metadata, so asking for them imports
nothing (a torch-free benchmark stays torch-free). The load average is recorded because this
machine is shared: a busy neighbour explains a slow absolute figure, not a side-by-side ratio.
"""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime

from training.provenance import DEFAULT_LIBRARIES, cpu_model_and_flags, git_revision, library_versions


def machine_facts(threads: int | None = None, libraries: tuple[str, ...] = DEFAULT_LIBRARIES) -> dict:
    """CPU model and flags, cores, the threads the benchmark used, versions, revision, load, time."""
    model, flags = cpu_model_and_flags()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": model,
        "cpu_flags": flags,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "threads": threads,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "libraries": library_versions(libraries),
        "git_revision": git_revision(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    }
