"""Export tests build torch models and ONNX sessions: torch keeps to two threads in each test module."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def frugal_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)
