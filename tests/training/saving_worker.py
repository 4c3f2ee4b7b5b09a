"""A process that saves, for the tests of killed and refused saves.

    python -m tests.training.saving_worker loop OUT      # versions 1, 2, ... of a model folder (OUT/model) and a
                                                        # training state (OUT/state/checkpoints/step-N), until killed
    python -m tests.training.saving_worker limited OUT  # version 1 of OUT/model, then version 2 under a file size
                                                        # limit smaller than its weights; prints the error's line

Version v is a tiny classifier whose every weight is v, saved the way `berth finetune` saves its model (a
temporary folder moved into place, berth_task.json last) and the way the training loop saves its state.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import sys
from pathlib import Path

import torch

from tasks.runtime.spec import TaskSpec
from tests.training.tiny_training import tiny_classifier
from training.bert.checkpoint import save_pretrained
from training.errors import UserFacingError
from training.finetuning.finetune import model_staging, staged_model
from training.loop.training_state import CHECKPOINTS_DIR, save_training_state

STATE_FLOATS = 2**20  # 4 MB: a training state takes a while to write, so kills land inside writes too


def model_of(version: int) -> torch.nn.Module:
    model = tiny_classifier()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float(version))
    return model


def publish_model(out: Path, version: int) -> None:
    model = model_of(version)
    with staged_model(out, model_staging(out, model, out)) as staging:
        save_pretrained(model, staging)
        TaskSpec(task="classification", labels=["LABEL_0", "LABEL_1"], max_seq_length=12).save(staging)
        (staging / "version.json").write_text(json.dumps(version), encoding="utf-8")


def save_state(out: Path, version: int) -> None:
    """Step `version`'s state; the one two versions back is deleted, as the loop keeps its last two."""
    folder = out / CHECKPOINTS_DIR / f"step-{version:08d}"
    save_training_state(folder, {"step": version, "weights": torch.full((STATE_FLOATS,), float(version))})
    shutil.rmtree(out / CHECKPOINTS_DIR / f"step-{version - 2:08d}", ignore_errors=True)


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode == "loop":
        (out / "model").mkdir(parents=True, exist_ok=True)
        for version in range(1, 10**6):
            publish_model(out / "model", version)
            save_state(out / "state", version)
            (out / "saving").touch()  # one round done: the test may kill from now on
    elif mode == "limited":
        (out / "model").mkdir(parents=True, exist_ok=True)
        publish_model(out / "model", 1)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
        weights = (out / "model" / "model.safetensors").stat().st_size
        resource.setrlimit(resource.RLIMIT_FSIZE, (weights // 2, weights // 2))
        try:
            publish_model(out / "model", 2)
        except UserFacingError as error:
            print(error)
            sys.exit(2)
    os._exit(0)


if __name__ == "__main__":
    main()
