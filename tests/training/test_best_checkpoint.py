"""Best checkpoint and early stopping in the real training loop, on dev curves planted by the test; exact
resume of both after a real SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training.planted_training import run

ROOT = Path(__file__).resolve().parents[2]


def test_the_best_evaluation_is_kept_not_the_last(tmp_path):
    # Higher is better: the peak at step 6 is kept, not the 0.65 of the last step.
    curve = {2: 0.50, 4: 0.60, 6: 0.80, 8: 0.70, 10: 0.65, 12: 0.65, 14: 0.60, 16: 0.62, 18: 0.61, 20: 0.65}
    record = run(tmp_path / "up", curve=curve, patience=None)
    assert record["steps"] == 20 and record["stopped_by"] == "steps"
    assert record["best"]["step"] == 6 and record["best"]["value"] == 0.80
    assert [e["step"] for e in record["best"]["evaluations"]] == list(range(2, 21, 2))
    # The kept weights are those the evaluation of step 6 was shown, and no other step's.
    assert record["best_weights"] == record["seen"]["6"]
    assert record["best_weights"] != record["seen"]["20"]
    # Older best weights are deleted as training states are saved: one copy left.
    assert [p.name for p in (tmp_path / "up" / "best").iterdir()] == ["step-00000006"]


def test_a_loss_is_best_when_lowest(tmp_path):
    curve = {2: 0.9, 4: 0.5, 6: 0.3, 8: 0.4, 10: 0.35, 12: 0.31, 14: 0.5, 16: 0.6, 18: 0.7, 20: 0.8}
    record = run(tmp_path / "down", curve=curve, patience=2, metric="loss")
    assert record["best"]["step"] == 6 and record["best"]["greater_is_better"] is False
    assert record["steps"] == 10 and record["early_stopping"]["stopped_at"] == 10  # 8 and 10 are higher


def test_early_stopping_stops_after_patience_evaluations_without_a_better_one(tmp_path):
    record = run(tmp_path / "stop")  # the planted curve: best at 6, then 8, 10, 12 no better, patience 3
    assert record["steps"] == 12 and record["stopped_by"] == "callback"
    assert record["early_stopping"] == {"best": 0.70, "evaluations_without_improvement": 3, "stopped_at": 12}
    assert record["best"]["step"] == 6 and [e["step"] for e in record["best"]["evaluations"]] == [2, 4, 6, 8, 10, 12]
    assert record["best_weights"] == record["seen"]["6"]
    lines = [json.loads(line) for line in (tmp_path / "stop" / "metrics.jsonl").read_text().splitlines()]
    assert max(line["step"] for line in lines) == 12  # nothing trained after the stop


def _killed_then_resumed(out: Path, hang_after_step: int, threads: str = "1", resume_threads: str = "1") -> dict:
    command = [sys.executable, "-m", "tests.training.planted_training", str(out)]
    process = subprocess.Popen([*command, "--hang-after-step", str(hang_after_step), "--threads", threads], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not (out / "hanging").exists():
            assert process.poll() is None, "the run ended before it was killed"
            assert time.monotonic() < deadline, "the run never reached the kill point"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        process.kill()
    assert not (out / "result.json").exists()
    (out / "hanging").unlink()
    subprocess.run([*command, "--threads", resume_threads], cwd=ROOT, check=True, timeout=300)
    return json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("kill_after_step", [6, 10])
def test_sigkill_then_resume_keeps_the_best_and_the_patience(tmp_path, kill_after_step):
    # After step 6: the best weights of step 6 were written after the last training state (step 4), which says
    # the best is step 4; the resumed run drops them and writes them again when it evaluates step 6 again.
    # After step 10: the state of step 8 holds best = step 6 and one evaluation without improvement; a resumed
    # run that forgot either would train past step 12 and keep step 14's 0.90.
    expected = run(tmp_path / "uninterrupted")
    resumed = _killed_then_resumed(tmp_path / "killed", kill_after_step)
    assert resumed["steps"] == expected["steps"] == 12
    assert resumed["best"] == expected["best"] and resumed["best"]["step"] == 6
    assert resumed["early_stopping"] == expected["early_stopping"]
    assert resumed["best_weights"] == expected["best_weights"] == expected["seen"]["6"]
    assert [p.name for p in (tmp_path / "killed" / "best").iterdir()] == ["step-00000006"]


def test_a_resumed_run_keeps_the_threads_its_training_state_was_computed_with(tmp_path):
    # The count picked by default follows the machine's load at start, and the count changes the weights' bits.
    # One more thread than this process may use: a count the default never picks, so a resume that took the
    # default would end with other weights.
    threads = len(os.sched_getaffinity(0)) + 1
    expected = run(tmp_path / "uninterrupted", threads=threads)
    assert expected["best_weights"] != run(tmp_path / "one-thread", threads=1)["best_weights"]  # the bits do move
    resumed = _killed_then_resumed(tmp_path / "killed", 6, threads=str(threads), resume_threads="auto")
    assert resumed["best_weights"] == expected["best_weights"] and resumed["steps"] == 12
    assert json.loads((tmp_path / "killed" / "train_settings.json").read_text())["threads"] == threads
