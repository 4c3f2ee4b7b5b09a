"""berth's version: the installed distribution's (pyproject.toml's `version`), the one source the CLI, the
service and bundle manifests report."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def berth_version() -> str:
    try:
        return version("berth")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"
