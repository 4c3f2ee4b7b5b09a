"""What berth guarantees when training fails: a diverging run stops (or skips, counted) and keeps its last good
state; a killed or refused save leaves the previous complete model folder and training states, or none.

The kills are real SIGKILLs of a process that does nothing but save; the refused write is a real one: the process
runs under RLIMIT_FSIZE (with SIGXFSZ ignored, the kernel fails the write with EFBIG, as a full disk fails it with
ENOSPC), since a full tmpfs needs root.
"""

from __future__ import annotations

import json
import math
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tasks.runtime.spec import TaskSpec
from tests.training.tiny_training import LabelledTokens, collate_labelled, tiny_classifier
from training.bert.checkpoint import load_pretrained
from training.bert.model import BertForSequenceClassification
from training.errors import TrainingDiverged
from training.loop.metrics_log import METRICS_FILE
from training.loop.settings import TrainSettings
from training.loop.trainer import FINAL_MODEL_DIR, train
from training.loop.training_state import list_training_states, load_training_state

REPO = Path(__file__).resolve().parents[2]
# A learning rate of 1e12 makes the first update push the weights past what fp32 can square: the loss of step 2
# is nan (measured: step 1 logs 0.69, every later step nan).
DIVERGING = {"learning_rate": 1e12, "max_steps": 12, "batch_size": 8, "warmup_steps": 0, "log_every_steps": 1,
             "save_every_steps": 1, "precision": "fp32", "num_threads": 1, "progress_bar": False}


def logged_losses(out: Path) -> dict[int, float | None]:
    records = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r.get("split") != "eval"}


def test_a_diverging_run_stops_at_the_step_and_keeps_the_last_good_state(tmp_path):
    with pytest.raises(TrainingDiverged, match=r"^training diverged at step 2: loss nan") as stopped:
        train(tiny_classifier(), LabelledTokens(), collate_labelled, TrainSettings(output_dir=tmp_path, **DIVERGING),
              on_save=lambda model, folder: None)
    assert "--max-nonfinite-steps" in str(stopped.value)
    assert [p.name for p in list_training_states(tmp_path)] == ["step-00000001"]
    state = load_training_state(list_training_states(tmp_path)[-1])
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert not (tmp_path / FINAL_MODEL_DIR).exists()  # nothing that looks like a finished model
    losses = logged_losses(tmp_path)
    assert list(losses) == [1] and math.isfinite(losses[1])


def test_skipping_non_finite_steps_is_counted_and_bounded(tmp_path):
    skipped = train(tiny_classifier(), LabelledTokens(), collate_labelled,
                    TrainSettings(output_dir=tmp_path / "skip", max_nonfinite_steps=11, **DIVERGING))
    assert skipped.steps == 12 and skipped.nonfinite_steps == 11
    states = list_training_states(tmp_path / "skip")
    assert load_training_state(states[-1])["nonfinite_steps"] == 11
    # Skipped steps never reach the weights: the last state's are those of a run stopped after step 1.
    last = load_training_state(states[-1])["model"]
    for name, tensor in train_until_step_one(tmp_path / "one").items():
        torch.testing.assert_close(last[name], tensor, rtol=0, atol=0, msg=name)
    losses = logged_losses(tmp_path / "skip")  # a window of skipped steps logs no loss, not nan
    assert math.isfinite(losses[1]) and all(losses[step] is None for step in range(2, 13))

    with pytest.raises(TrainingDiverged, match=r"^training diverged at step 5: .*more skipped steps than 3"):
        train(tiny_classifier(), LabelledTokens(), collate_labelled,
              TrainSettings(output_dir=tmp_path / "bounded", max_nonfinite_steps=3, **DIVERGING))


def train_until_step_one(out: Path) -> dict[str, torch.Tensor]:
    train(tiny_classifier(), LabelledTokens(), collate_labelled, TrainSettings(output_dir=out, **{
        **DIVERGING, "max_steps": 1}))
    return load_training_state(list_training_states(out)[-1])["model"]


def worker(mode: str, out: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.training.saving_worker", mode, str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def check_model_folder(folder: Path) -> int | None:
    """The version of the complete model in `folder` (every weight equals it), or None when none looks finished."""
    if not (folder / "berth_task.json").is_file():
        return None
    version = json.loads((folder / "version.json").read_text())
    model, report = load_pretrained(BertForSequenceClassification, folder)
    assert str(report) == "all weights matched"
    assert all(bool((p == version).all()) for p in model.parameters())
    assert TaskSpec.load(folder).labels == ["LABEL_0", "LABEL_1"]
    return version


def test_a_kill_during_saves_leaves_complete_saves_or_none(tmp_path):
    rng = random.Random(51)
    for kill in range(3):
        out = tmp_path / f"kill{kill}"
        process = worker("loop", out)
        try:
            deadline = time.monotonic() + 120
            while not (out / "saving").exists():
                assert process.poll() is None, process.stdout.read()
                assert time.monotonic() < deadline, "no save finished"
                time.sleep(0.05)
            time.sleep(rng.uniform(0.05, 1.0))
            process.send_signal(signal.SIGKILL)
        finally:
            process.kill()
            process.wait()
        model_version = check_model_folder(out / "model")
        states = list_training_states(out / "state")
        assert states, "the round that finished before the kill left a training state"
        for folder in states:
            state = load_training_state(folder)
            assert folder.name == f"step-{state['step']:08d}" and bool((state["weights"] == state["step"]).all())
        # The model of a round is published before its state: at most one version ahead of the last state.
        last_state = load_training_state(states[-1])["step"]
        assert model_version is None or last_state <= model_version <= last_state + 1


def test_a_refused_write_keeps_the_previous_model_folder(tmp_path):
    done = worker("limited", tmp_path)
    output, _ = done.communicate(timeout=300)
    assert done.returncode == 2, output
    assert output.strip().splitlines()[-1].startswith(
        f"could not save the fine-tuned model in {tmp_path / 'model'}: a file would pass the file size limit")
    assert check_model_folder(tmp_path / "model") == 1
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "berth_task.json", "config.json", "model.safetensors", "version.json"]  # no temporary folder left
