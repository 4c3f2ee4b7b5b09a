"""Where a result came from: the git revision and the library versions, for run records and benchmarks.

Versions are read from the installed distributions' metadata, so asking for them imports nothing.
"""

from __future__ import annotations

import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

DEFAULT_LIBRARIES = ("torch", "transformers", "onnxruntime", "onnx", "numpy", "tokenizers")


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
