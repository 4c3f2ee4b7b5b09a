"""Where a result came from: the git revision, the library versions and the CPU, for run records and benchmarks.

Versions are read from the installed distributions' metadata, so asking for them imports nothing.
"""

from __future__ import annotations

import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

DEFAULT_LIBRARIES = ("torch", "transformers", "onnxruntime", "onnx", "numpy", "tokenizers")
# The vector and matrix extensions that decide training, bf16 and int8 speed.
CPU_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16",
             "amx_int8")


def cpu_model_and_flags() -> tuple[str, list[str]]:
    """From /proc/cpuinfo (Linux): the CPU's model name and which of CPU_FLAGS it has; elsewhere whatever
    `platform` knows and no flags."""
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
            flags = [f for f in CPU_FLAGS if f in present]
    return model or platform.processor() or "unknown", flags


def library_versions(names: tuple[str, ...] = DEFAULT_LIBRARIES) -> dict[str, str | None]:
    """Installed version of each distribution, None when it is not installed."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def git_revision(repo: Path | None = None) -> str | None:
    """The checked-out commit, with "+dirty" when the working tree has changes; None outside git."""
    cwd = repo or Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=cwd, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
