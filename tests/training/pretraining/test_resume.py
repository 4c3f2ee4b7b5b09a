"""A `berth pretrain` killed mid-epoch (SIGKILL, a real process) and run again with the same command ends with the
same weights and the same per-step losses as a run never killed; data changed under a saved training state is
refused in one line instead of mixed in."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from training.bert.checkpoint import default_base_path, read_state_dict

REPO = Path(__file__).resolve().parents[3]
STEPS = 24


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    for f in sorted((shared_data / "pretraining" / "inaugural").glob("*.txt"))[:10]:
        shutil.copy(f, folder / f.name)
    return folder


def _command(corpus: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "berth.cli", "pretrain", str(corpus), "--out", str(out), "--preset", "tiny",
            "--tokenizer", str(default_base_path()), "--max-seq-length", "64", "--batch-size", "8",
            "--max-steps", str(STEPS), "--save-every-steps", "4", "--log-every", "1", "--threads", "1",
            "--precision", "fp32", "--shard-mb", "0.05", "--shuffle-window", "2"]


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r.get("split") != "eval"}


def test_a_killed_run_resumes_to_the_same_weights_and_losses(corpus, tmp_path):
    whole = _run(_command(corpus, tmp_path / "whole"), tmp_path)
    assert whole.returncode == 0, whole.stderr

    out = tmp_path / "killed"
    command = _command(corpus, out)
    process = subprocess.Popen(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (out / "checkpoints" / "step-00000008").is_dir():
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert not (out / "pretrain_run.json").exists(), "the kill came after the end"

    resumed = _run(command, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr
    record = json.loads((out / "pretrain_run.json").read_text())
    assert record["train_result"]["steps"] == STEPS
    assert _losses(out) == _losses(tmp_path / "whole")
    expected, got = read_state_dict(tmp_path / "whole"), read_state_dict(out)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_changed_data_under_a_saved_state_is_refused(corpus, tmp_path):
    copy = tmp_path / "corpus"
    shutil.copytree(corpus, copy)
    command = _command(copy, tmp_path / "out")
    command[command.index("--max-steps") + 1] = "4"
    assert _run(command, tmp_path).returncode == 0
    changed = sorted(copy.glob("*.txt"))[0]
    changed.write_text(changed.read_text(encoding="utf-8").replace("the", "THE"), encoding="utf-8")
    command[command.index("--max-steps") + 1] = "8"
    again = _run(command, tmp_path)
    assert again.returncode == 2
    last = again.stderr.strip().splitlines()[-1]
    assert last.startswith("berth pretrain: the data changed since") and f"{changed.resolve()} changed" in last
    assert "Traceback" not in again.stderr


def test_a_second_run_on_a_live_runs_folder_is_refused(corpus, tmp_path):
    out = tmp_path / "out"
    command = _command(corpus, out)
    command[command.index("--max-steps") + 1] = "400"
    live = subprocess.Popen(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (out / "checkpoints").is_dir():
            time.sleep(0.05)
        second = _run(command, tmp_path)
        assert second.returncode == 2
        last = second.stderr.strip().splitlines()[-1]
        assert last.startswith("berth pretrain: ") and f"pid {live.pid}" in last and "Traceback" not in second.stderr
    finally:
        os.killpg(live.pid, signal.SIGKILL)
        live.wait(timeout=30)
