"""`berth finetune` evaluating on dev while it trains, from a tiny real BERT folder: the best checkpoint is the
folder saved, its curves stay beside it (metrics.jsonl, TensorBoard, MLflow: read back with their own readers),
a SIGKILL mid-run then resume ends with the same folder, and bad settings fail before training starts."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from berth.cli import main
from tests.training.tiny_training import save_tiny_bert_folder
from training.finetuning.evaluate import evaluate_model
from training.finetuning.finetune import FinetuneSettings, run_finetune

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "data" / "samples" / "topics"


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> Path:
    """A 2-layer H32 BERT (random weights) saved as a model folder with the default base's tokenizer."""
    return save_tiny_bert_folder(tmp_path_factory.mktemp("tiny-base"), max_position_embeddings=64)


def _flags(base: Path, out: Path, *extra: str) -> list[str]:
    return ["finetune", "--task", "classification", "--train", str(SAMPLES / "train.jsonl"),
            "--dev", str(SAMPLES / "dev.jsonl"), "--out", str(out), "--base", str(base),
            "--max-train-examples", "200", "--max-eval-examples", "40", "--max-seq-length", "32",
            "--batch-size", "4", "--epochs", "1", "--lr", "1e-3", "--precision", "fp32", "--threads", "1",
            "--eval-every-steps", "5", *extra]


def test_the_best_checkpoint_is_saved_with_curves_that_last(tmp_path, tiny_base, monkeypatch):
    mlruns = tmp_path / "mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlruns.as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    out = tmp_path / "run"
    settings = FinetuneSettings(task="classification", train_file=SAMPLES / "train.jsonl",
                                dev_file=SAMPLES / "dev.jsonl", out=out, base=str(tiny_base), max_train_examples=200,
                                max_eval_examples=40, max_seq_length=32, batch_size=4, epochs=1, learning_rate=1e-3,
                                precision="fp32", num_threads=1, eval_every_steps=5,
                                report_to=["tensorboard", "mlflow"])
    metrics = run_finetune(settings)
    eval_steps = list(range(5, 51, 5))  # 200 examples / batch 4 = 50 steps, evaluated every 5

    record = json.loads((out / "finetune_run.json").read_text())
    best = record["best"]
    accuracies = [e["accuracy"] for e in best["evaluations"]]
    assert [e["step"] for e in best["evaluations"]] == eval_steps and best["metric"] == "accuracy"
    assert best["step"] == eval_steps[accuracies.index(max(accuracies))]  # the first of the highest
    assert best["dev_sample_examples"] == 40 and best["eval_seconds"] > 0 and best["last_step"] == 50
    # The folder saved is the best step's model: scored again from disk, it gives that evaluation's figure.
    assert evaluate_model(out, SAMPLES / "dev.jsonl", limit=40)["accuracy"] == pytest.approx(best["value"])
    assert metrics["accuracy"] == pytest.approx(best["value"])

    # metrics.jsonl stays in the output folder (the training state is gone) and `berth plot OUT` draws it.
    assert not (out / "train_state").exists()
    assert record["train_result"]["metrics_path"] == str(out / "metrics.jsonl")
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r.get("split") == "eval"] == eval_steps
    assert [r["step"] for r in lines if "loss" in r] == [10, 20, 30, 40, 50]
    assert main(["plot", str(out)]) == 0 and (out / "metrics.png").stat().st_size > 10_000

    # TensorBoard: read with its own event reader.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    dev = events.Scalars("dev/accuracy")
    assert [e.step for e in dev] == eval_steps
    assert [e.value for e in dev] == pytest.approx(accuracies)
    assert [e.step for e in events.Scalars("train/loss")] == [10, 20, 30, 40, 50]
    assert {"train/learning_rate", "train/tokens_per_s", "final_dev/accuracy"} <= set(events.Tags()["scalars"])

    # MLflow: one finished run in the local store, read with MlflowClient.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlruns.as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("berth").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["learning_rate"] == "0.001" and run.data.params["eval_every_steps"] == "5"
    history = client.get_metric_history(run.info.run_id, "dev/accuracy")
    assert [m.step for m in history] == eval_steps and [m.value for m in history] == pytest.approx(accuracies)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [10, 20, 30, 40, 50]
    copy = Path(client.download_artifacts(run.info.run_id, "model/model.safetensors", str(tmp_path)))
    assert copy.read_bytes() == (out / "model.safetensors").read_bytes()


def _comparable(out: Path) -> dict:
    """What must not depend on a kill: the weights, the best record and the curves (timings aside)."""
    record = json.loads((out / "finetune_run.json").read_text())
    best = {k: v for k, v in record["best"].items() if "seconds" not in k and k not in ("evaluations_this_invocation",
                                                                                        "eval_share_of_wall")}
    curves = [{k: v for k, v in line.items() if k in ("step", "split", "loss", "accuracy", "learning_rate")}
              for line in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]
    return {"weights": (out / "model.safetensors").read_bytes(), "task": (out / "berth_task.json").read_text(),
            "best": best, "curves": curves, "dev_metrics": record["dev_metrics"]}


def test_sigkill_mid_finetune_then_resume_ends_with_the_same_folder(tmp_path, tiny_base):
    # A line per step (a line's averages would otherwise span the resume); patience 6 of 10 evaluations.
    extra = ("--save-every-steps", "5", "--early-stopping-patience", "6", "--log-every-steps", "1")
    assert main(_flags(tiny_base, tmp_path / "uninterrupted", *extra)) == 0

    out = tmp_path / "killed"
    command = [sys.executable, "-m", "berth.cli", *_flags(tiny_base, out, *extra)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        states = out / "train_state" / "checkpoints"
        while not any(p.name >= "step-00000015" for p in states.glob("step-*")):  # mid-run: 15 of 50 steps
            assert process.poll() is None and time.monotonic() < deadline, "the run ended before it was killed"
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        process.kill()
    assert not (out / "finetune_run.json").exists()
    subprocess.run(command, cwd=ROOT, check=True, timeout=300, stdout=subprocess.DEVNULL)
    assert _comparable(out) == _comparable(tmp_path / "uninterrupted")


def test_bad_settings_fail_in_one_line_before_training(tmp_path, tiny_base, capsys, monkeypatch):
    out = tmp_path / "bad"
    with pytest.raises(SystemExit) as exit_info:
        main(_flags(tiny_base, out, "--metric-for-best", "acuracy"))
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("berth finetune: unknown --metric-for-best 'acuracy'") and "accuracy" in message
    assert not (out / "train_state").exists()

    monkeypatch.setitem(sys.modules, "mlflow", None)  # what Python says of a package that is not installed
    with pytest.raises(SystemExit) as exit_info:
        main(_flags(tiny_base, out, "--report-to", "mlflow"))
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "berth finetune: --report-to mlflow: the mlflow package is not installed (pip install mlflow-skinny, or "
        "berth[track])")
    assert not (out / "train_state").exists()

    with pytest.raises(SystemExit) as exit_info:
        main(_flags(tiny_base, out, "--report-to", "wandb"))
    assert exit_info.value.code == 2 and "report_to" in capsys.readouterr().err
