"""The machine facts every benchmark writes beside its numbers, so a result can be rerun and compared.

Library versions are read from the installed distributions' metadata, so asking for them imports
nothing (a torch-free benchmark stays torch-free). The load average is recorded because this
machine is shared: a busy neighbour explains a slow absolute figure, not a side-by-side ratio.
"""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from pathlib import Path

from training.provenance import DEFAULT_LIBRARIES, git_revision, library_versions

_INTERESTING_CPU_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
                         "amx_bf16")


def _cpu_model_and_flags() -> tuple[str, list[str]]:
    """From /proc/cpuinfo (Linux); elsewhere whatever `platform` knows and no flags."""
    model, flags = None, []
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model is None:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            present = set(value.split())
            flags = [f for f in _INTERESTING_CPU_FLAGS if f in present]
    return model or platform.processor() or "unknown", flags


def machine_facts(threads: int | None = None, libraries: tuple[str, ...] = DEFAULT_LIBRARIES) -> dict:
    """CPU model and flags, cores, the threads the benchmark used, versions, revision, load, time."""
    model, flags = _cpu_model_and_flags()
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
