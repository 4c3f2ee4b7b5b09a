"""Training-state files: the resumable snapshots a run writes under <output>/checkpoints/step-N/.

Each is one trainer_state.pt (tensors, containers and plain values only: read back with
weights_only=True), written into a temporary sibling folder and renamed into place, so that a reader
sees either no snapshot or a complete one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from training.loop.saving import (
    atomic_directory,
    clean_stale_temporaries,
    disk_errors,
    ensure_free_space,
    tensor_bytes,
)

__all__ = ["CHECKPOINTS_DIR", "atomic_directory", "clean_stale_temporaries", "latest_training_state",
           "list_training_states", "load_training_state", "save_training_state"]

CHECKPOINTS_DIR = "checkpoints"
STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def list_training_states(output_dir: Path) -> list[Path]:
    """The complete training states in output_dir (its checkpoints/step-N folders), oldest first."""
    folder = Path(output_dir) / CHECKPOINTS_DIR
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir()
             if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def latest_training_state(output_dir: Path) -> Path | None:
    found = list_training_states(output_dir)
    return found[-1] if found else None


def save_training_state(folder: Path, state: dict[str, Any]) -> Path:
    """Write `state` (tensors, containers and plain values only) atomically to folder/trainer_state.pt. Not enough
    free space, or a write the disk refuses, is a UserFacingError; the earlier training states stay as they were."""
    folder = Path(folder)
    what = f"the training state of step {state.get('step', '?')}"
    ensure_free_space(folder.parent, tensor_bytes(state), what)
    with disk_errors(folder.parent, what, "the earlier training states are kept"), atomic_directory(folder) as tmp:
        torch.save(state, tmp / STATE_FILE)
    return folder


def load_training_state(folder: Path) -> dict[str, Any]:
    """Read a training state with weights_only=True: no arbitrary objects are unpickled."""
    return torch.load(Path(folder) / STATE_FILE, map_location="cpu", weights_only=True)
