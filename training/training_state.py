"""Training-state files: the resumable snapshots a run writes under <output>/checkpoints/step-N/.

Each is one trainer_state.pt (tensors, containers and plain values only: read back with
weights_only=True), written into a temporary sibling folder and renamed into place, so that a reader
sees either no snapshot or a complete one.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

CHECKPOINTS_DIR = "checkpoints"
STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `final` to fill; on success fsync it and rename it to `final`.

    A reader sees either no `final` or a complete one: a kill or an exception while writing leaves at
    most a hidden ".tmp-" folder (removed on exception here, and by `clean_stale_temporaries`).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        if final.exists():  # replace: move the old one aside first, rename is atomic only onto nothing
            old = final.parent / f".old-{final.name}-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_path(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            _fsync_path(Path(dirpath) / name)
        _fsync_path(Path(dirpath))


def clean_stale_temporaries(folder: Path) -> None:
    """Remove the ".tmp-"/".old-" leftovers of a save that a kill interrupted."""
    if folder.is_dir():
        for child in folder.iterdir():
            if child.name.startswith((".tmp-", ".old-")):
                shutil.rmtree(child, ignore_errors=True)


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
    """Write `state` (tensors, containers and plain values only) atomically to folder/trainer_state.pt."""
    with atomic_directory(folder) as tmp:
        torch.save(state, tmp / STATE_FILE)
    return folder


def load_training_state(folder: Path) -> dict[str, Any]:
    """Read a training state with weights_only=True: no arbitrary objects are unpickled."""
    return torch.load(Path(folder) / STATE_FILE, map_location="cpu", weights_only=True)
