"""The tree passes ruff with the project's settings (pyproject.toml [tool.ruff]: pycodestyle with 120 columns,
pyflakes, import order, bugbear, pyupgrade), as `make lint` runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_tree_passes_ruff():
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.is_file():
        pytest.fail(f"{ruff} is missing: install the test extra (pip install -e '.[test]')")
    result = subprocess.run([str(ruff), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
