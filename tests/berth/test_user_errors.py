"""Every error a user can cause in `berth finetune` and `berth sweep` is one line `berth <command>: ...` and exit
code 2, without a traceback (BERTH_DEBUG=1 keeps it): real `berth` processes on slices of the shipped topics sample,
from the real default base. A disk that refuses the save (a real write failing under RLIMIT_FSIZE) keeps the earlier
model; a diverging run writes none."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOPICS = REPO / "data" / "samples" / "topics" / "train.jsonl"
TINY = ["--task", "classification", "--max-steps", "2", "--batch-size", "4", "--max-seq-length", "32", "--threads",
        "1", "--precision", "fp32", "--no-progress-bar"]


def berth(*args: str, debug: bool = False, limit_bytes: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("BERTH_DEBUG", None)
    if debug:
        env["BERTH_DEBUG"] = "1"

    def limited() -> None:  # a write past the limit fails with EFBIG, as one on a full disk fails with ENOSPC
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-m", "berth.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, preexec_fn=limited if limit_bytes else None)


def last_line(done: subprocess.CompletedProcess) -> str:
    return done.stderr.strip().splitlines()[-1]


def topics_slice(path: Path, broken_line_6: bytes | None = None) -> Path:
    lines = TOPICS.read_bytes().splitlines(keepends=True)[:24]
    if broken_line_6 is not None:
        lines[5] = broken_line_6 + b"\n"
    path.write_bytes(b"".join(lines))
    return path


CASES = {
    "broken-json": (b'{"text": "cut short', "{train}:6: invalid JSON: Invalid control character at (character 20)"),
    "not-utf8": (b'{"text": "caf\xe9", "label": "places"}',
                 "{train}:6: bytes that are not UTF-8 (0xe9 at character 14); save the file as UTF-8"),
    "no-label": (b'{"text": "a row without its label"}',
                 "{train}:6: no 'label' value (a training example needs its label)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_row_is_one_line_naming_file_and_line(tmp_path, case):
    row, message = CASES[case]
    train = topics_slice(tmp_path / "train.jsonl", row)
    done = berth("finetune", *TINY, "--train", str(train), "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr
    assert last_line(done) == "berth finetune: " + message.format(train=train)
    assert "Traceback" not in done.stderr


def test_an_empty_file_a_base_that_is_no_checkpoint_and_too_long_sequences(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    done = berth("finetune", *TINY, "--train", str(empty), "--out", str(tmp_path / "out"))
    assert (done.returncode, last_line(done)) == (2, f"berth finetune: {empty}: no examples: the file is empty")

    train = topics_slice(tmp_path / "train.jsonl")
    not_a_model = tmp_path / "notes"
    not_a_model.mkdir()
    (not_a_model / "config.json").write_text('{"model_type": "bert", "hidden_size": 8, "num_hidden_layers": 1, '
                                             '"num_attention_heads": 1, "vocab_size": 10}')
    done = berth("finetune", *TINY, "--train", str(train), "--out", str(tmp_path / "out"), "--base", str(not_a_model))
    assert done.returncode == 2 and last_line(done).startswith(
        f"berth finetune: --base {not_a_model}: no weights (model.safetensors or pytorch_model.bin)")

    done = berth("finetune", *TINY, "--train", str(train), "--out", str(tmp_path / "out"), "--max-seq-length", "5000")
    assert done.returncode == 2 and last_line(done).startswith("berth finetune: --max-seq-length 5000 is longer than "
                                                               "the 512 positions of the base")
    assert "Traceback" not in done.stderr

    done = berth("finetune", *TINY, "--train", str(train), "--out", str(tmp_path / "out"), "--labels", "people,places")
    assert done.returncode == 2 and last_line(done) == (
        f"berth finetune: {train}: labels ['arts_media', 'science_tech', 'society'] are not among --labels "
        "['people', 'places']")

    debugged = berth("finetune", *TINY, "--train", str(empty), "--out", str(tmp_path / "out"), debug=True)
    assert debugged.returncode == 1 and "Traceback" in debugged.stderr


def test_outputs_and_settings_that_cannot_work_are_one_line_and_touch_nothing(tmp_path):
    train = topics_slice(tmp_path / "train.jsonl")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "notes.md").write_text("keep me too")

    def refused(command: str, *args: str) -> str:
        done = berth(command, *args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        return last_line(done)

    run = str(tmp_path / "run")  # no model is ever written there: each refusal comes before training
    assert refused("export", run, "--out", str(folder)) == (
        f"berth export: --out {folder} holds files and is not a bundle; name a new or empty folder (only a bundle is "
        "ever replaced)")
    assert refused("export", run, "--out", str(a_file)) == (
        f"berth export: --out {a_file} is a file; name a folder for the bundle")
    assert refused("export", run, "--out", str(tmp_path / "bundle"), "--dev-data", str(tmp_path / "nope.csv")) == (
        f"berth export: --dev-data {tmp_path / 'nope.csv'}: no such file")
    # a sweep's --export is refused before any trial, and the exporter itself never replaces such a folder, even
    # when told to replace what is there (force, as the sweep and build-defaults export)
    assert refused("sweep", *TINY, "--train", str(train), "--dev", str(train), "--out", str(tmp_path / "sweep"),
                   "--export", str(folder)) == (
        f"berth sweep: --export {folder} holds files and is not a bundle; name a new or empty folder (only a bundle "
        "is ever replaced)")
    from export.bundle_builder import export_bundle
    from export.settings import ExportSettings
    from training.errors import UserFacingError

    with pytest.raises(UserFacingError, match=f"--out {folder} holds files and is not a bundle"):
        export_bundle(ExportSettings(model_folder=Path(run), out=folder, force=True))
    assert (folder / "notes.md").read_text() == "keep me too" and a_file.read_text() == "keep me"

    assert refused("finetune", *TINY, "--train", str(train), "--out", str(a_file)) == (
        f"berth finetune: --out {a_file}: {a_file} is a file; name a folder for the run's outputs")
    assert refused("finetune", *TINY, "--train", str(train), "--out", run, "--resume", str(folder)).startswith(
        f"berth finetune: --resume {folder}: not a training state")
    assert refused("finetune", *TINY, "--train", str(train), "--out", run, "--feature-based").startswith(
        "berth finetune: --feature-based trains a tagging head")
    one_label = tmp_path / "one-label.jsonl"
    one_label.write_text("".join(f'{{"text": "row {i}", "label": "places"}}\n' for i in range(12)))
    assert refused("finetune", *TINY, "--train", str(one_label), "--out", run) == (
        f"berth finetune: {one_label}: every example has the label 'places'; a classifier needs examples of at "
        "least two labels (--labels names them all)")
    qa = [a if a != "classification" else "qa" for a in TINY]
    assert refused("finetune", *qa, "--train", str(train), "--out", run, "--max-seq-length", "64").startswith(
        "berth finetune: --max-seq-length 64 leaves no room for the context after a question of up to "
        "--max-query-length 64 tokens")
    assert refused("evaluate", run, str(train)).startswith(f"berth evaluate: {run}: neither a bundle")
    assert refused("evaluate", run, str(train), "--out", str(a_file / "report.json")) == (
        f"berth evaluate: --out {a_file / 'report.json'}: {a_file} is a file, not a folder")
    assert a_file.read_text() == "keep me" and not (Path(run) / "config.json").exists()  # no model was written


def test_bad_rows_skipped_are_listed_and_counted(tmp_path):
    train = topics_slice(tmp_path / "train.jsonl", b'{"text": "cut short')
    out = tmp_path / "out"
    done = berth("finetune", *TINY, "--train", str(train), "--out", str(out), "--bad-rows", "skip")
    assert done.returncode == 0, done.stderr
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [(e["file"], e["line"]) for e in errors] == [(str(train), 6)]
    record = json.loads((out / "finetune_run.json").read_text())
    assert record["bad_rows"] == {"policy": "skip", "count": 1, "file": "errors.jsonl"}
    assert record["train_examples"] == 23
    assert "Bad rows of the data skipped (listed in errors.jsonl): 1" in (out / "README.md").read_text()


def test_a_diverging_run_writes_no_model(tmp_path):
    train = topics_slice(tmp_path / "train.jsonl")
    out = tmp_path / "out"
    done = berth("finetune", *TINY, "--train", str(train), "--out", str(out), "--lr", "1e6", "--warmup-steps", "0",
                 "--max-steps", "4")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert last_line(done).startswith("berth finetune: training diverged at step 2: loss nan")
    assert not any((out / name).exists() for name in ("config.json", "model.safetensors", "berth_task.json"))


@pytest.mark.slow  # two fine-tuning runs from the real base
def test_a_refused_save_keeps_the_earlier_model(tmp_path):
    train = topics_slice(tmp_path / "train.jsonl")
    out = tmp_path / "out"
    good = berth("finetune", *TINY, "--train", str(train), "--out", str(out))
    assert good.returncode == 0, good.stderr
    weights = (out / "model.safetensors").read_bytes()
    # Again, where no file may pass 64 MB: the training state (about 3x the 90 MB of weights) is refused.
    refused = berth("finetune", *TINY, "--train", str(train), "--out", str(out), "--seed", "7",
                    limit_bytes=64 * 2**20)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert last_line(refused).startswith(f"berth finetune: could not save the training state of step 2 in {out}/")
    # torch.save reports the refused write without its errno: the line says what it can.
    assert "the write stopped short (a full disk, a quota or a file size limit)" in last_line(refused)
    assert (out / "model.safetensors").read_bytes() == weights and (out / "berth_task.json").is_file()
