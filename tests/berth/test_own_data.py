"""The tutorial's path on a user's own CSV, made here: fine-tune (killed, refused a second time, resumed), load the
folder in transformers, evaluate, export with gates on the model's own dev file, and predict refusing a file
without its text column.

The file is a support-ticket CSV as a user brings it: an id column, the text, four labels of uneven counts (and a
dev label training never saw). Every command runs as a user types it, `python -m berth.cli ...` in a subprocess,
from the folder the user works in. The expectations come from outside the code under test: transformers' own
pipeline on the saved folder, scikit-learn's classification_report and confusion_matrix on the predictions file,
the CSV's own ids and columns.
"""

from __future__ import annotations

import csv
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sklearn_metrics = pytest.importorskip("sklearn.metrics")
pytest.importorskip("pyarrow")

from tests.conftest import REPO  # noqa: E402

# What a ticket of each label says: a user's four queues, in uneven numbers.
TEMPLATES = {
    "billing": ["I was charged twice for order {n}", "refund the {n} dollars on my invoice",
                "my card was billed {n} times"],
    "login": ["cannot sign in after resetting my password", "two-factor code {n} never arrives", "account locked out"],
    "bug": ["the app crashes when I open screen {n}", "error {n} when saving a draft",
            "the export button does nothing"],
    "shipping": ["parcel {n} has not arrived yet", "tracking number {n} shows no movement",
                 "delivered to a wrong address"],
}
TRAIN_COUNTS = {"billing": 96, "login": 64, "bug": 48, "shipping": 32}
DEV_COUNTS = {"billing": 10, "login": 8, "bug": 8, "shipping": 6}
UNSEEN = "refund-request"  # a dev label no training row has
MAX_LENGTH = "32"
FINETUNE = ["finetune", "--task", "classification", "--train", "train.csv", "--dev", "dev.csv", "--out",
            "runs/my-tickets", "--epochs", "6", "--batch-size", "8", "--max-seq-length", MAX_LENGTH, "--seed", "3",
            "--precision", "fp32", "--threads", "1", "--save-every-minutes", "0.03", "--lr", "1e-4"]


def write_tickets(path: Path, counts: dict[str, int], rng: random.Random, prefix: str, extra: int = 0) -> None:
    rows = [(label, rng.choice(TEMPLATES[label]).format(n=rng.randint(2, 999)))
            for label, count in counts.items() for _ in range(count)]
    rows += [(UNSEEN, f"please refund order {rng.randint(2, 999)}") for _ in range(extra)]
    rng.shuffle(rows)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["ticket_id", "text", "label"])
        writer.writerows((f"{prefix}-{i:03d}", text, label) for i, (label, text) in enumerate(rows))


def berth(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "BERTH_PROGRESS_SECONDS": "1"}
    return subprocess.run([sys.executable, "-m", "berth.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout)


def states(out: Path) -> list[Path]:
    return sorted((out / "train_state" / "checkpoints").glob("step-*/trainer_state.pt"))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> dict:
    """The user's folder after: a run killed after its first saved state, a second run refused meanwhile, and
    the same command again, to the end."""
    work = tmp_path_factory.mktemp("tickets")
    rng = random.Random(11)
    write_tickets(work / "train.csv", TRAIN_COUNTS, rng, "t")
    write_tickets(work / "dev.csv", DEV_COUNTS, rng, "d", extra=3)
    out = work / "runs" / "my-tickets"
    env = {**os.environ, "PYTHONPATH": str(REPO), "BERTH_PROGRESS_SECONDS": "1"}
    with (work / "first.log").open("w") as log:
        first = subprocess.Popen([sys.executable, "-m", "berth.cli", *FINETUNE], cwd=work, env=env, stdout=log,
                                 stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 300
        while not states(out) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first.poll() is None and states(out), "the first run saved no training state while running"
        second = berth(FINETUNE, work)
        assert first.poll() is None, "the first run ended before the second was tried: make it longer"
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    killed_at = [int(re.search(r"step-(\d+)", str(p)).group(1)) for p in states(out)]
    again = berth(FINETUNE, work)
    assert again.returncode == 0, again.stderr[-3000:]
    return {"work": work, "out": out, "first": (work / "first.log").read_text(), "second": second,
            "again": again, "killed_at": killed_at, "first_pid": first.pid}


def test_a_second_run_on_the_folder_is_refused_naming_the_live_one(work):
    second = work["second"]
    assert second.returncode == 2
    message = second.stderr.strip().splitlines()[-1]
    assert message.startswith("berth finetune: runs/my-tickets is in use by berth finetune")
    assert f"pid {work['first_pid']} on " in message and "Traceback" not in second.stderr


def test_the_killed_run_resumes_from_its_last_saved_step(work):
    assert "no saved state in" in work["first"] and "starting at step 0" in work["first"]
    stderr = work["again"].stderr
    assert "a stale lock of berth finetune" in stderr and str(work["first_pid"]) in stderr
    resumed = int(re.search(r"resumed from step (\d+)", stderr).group(1))
    assert resumed == max(work["killed_at"]) > 0
    run = json.loads((work["out"] / "finetune_run.json").read_text())
    assert run["schedule"]["steps"] == run["schedule"]["planned_steps"] == 6 * 240 // 8
    assert not (work["out"] / ".berth.lock").exists() and not (work["out"] / "train_state").exists()


def test_finetune_warns_of_a_dev_label_training_never_saw(work):
    assert f"dev labels never seen in training: '{UNSEEN}' (3 in dev)" in work["again"].stderr
    run = json.loads((work["out"] / "finetune_run.json").read_text())
    assert any(UNSEEN in warning for warning in run["warnings"])


def dev_rows(work) -> list[dict]:
    with (work["work"] / "dev.csv").open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def evaluated(work) -> dict:
    result = berth(["evaluate", "runs/my-tickets", "dev.csv", "--out", "eval/report.json", "--id-column",
                    "ticket_id", "--output-format", "table"], work["work"])
    assert result.returncode == 0, result.stderr[-3000:]
    predictions = [json.loads(line) for line in
                   (work["work"] / "eval" / "report.predictions.jsonl").read_text().splitlines()]
    return {"table": result.stdout, "report": json.loads((work["work"] / "eval" / "report.json").read_text()),
            "predictions": predictions}


def test_transformers_pipeline_gives_berths_answers_on_the_dev_set(work, evaluated):
    folder = str(work["out"])
    with pytest.raises(ValueError):  # the plain class would read a pooler this mean-pooled head has not
        transformers.pipeline("text-classification", model=folder)
    classify = transformers.pipeline("text-classification", model=folder, trust_remote_code=True, device="cpu")
    theirs = classify([row["text"] for row in dev_rows(work)], truncation=True, max_length=int(MAX_LENGTH))
    ours = [p["prediction"] for p in evaluated["predictions"]]
    assert [t["label"] for t in theirs] == [o["label"] for o in ours]
    assert max(abs(t["score"] - o["score"]) for t, o in zip(theirs, ours)) < 1e-4
    card = (work["out"] / "README.md").read_text()
    assert "trust_remote_code=True" in card and "also loads in transformers (`AutoModel" not in card


def test_evaluate_reports_per_label_figures_and_the_confusion_matrix(work, evaluated):
    report, predictions, rows = evaluated["report"], evaluated["predictions"], dev_rows(work)
    assert [p["id"] for p in predictions] == [row["ticket_id"] for row in rows]
    assert [p["gold"] for p in predictions] == [row["label"] for row in rows]
    gold, predicted = [row["label"] for row in rows], [p["prediction"]["label"] for p in predictions]
    expected = sklearn_metrics.classification_report(gold, predicted, output_dict=True, zero_division=0)
    for label, figures in report["per_label"].items():
        assert figures["support"] == expected[label]["support"]
        for name, theirs in (("precision", "precision"), ("recall", "recall"), ("f1", "f1-score")):
            assert figures[name] == pytest.approx(expected[label][theirs])
    for average in ("macro", "weighted"):
        assert report["averages"][average]["f1"] == pytest.approx(expected[f"{average} avg"]["f1-score"])
    labels = report["confusion_matrix"]["labels"]
    assert UNSEEN in labels and report["per_label"][UNSEEN]["recall"] == 0.0
    assert report["confusion_matrix"]["rows"] == sklearn_metrics.confusion_matrix(gold, predicted,
                                                                                  labels=labels).tolist()
    assert report["metrics"]["accuracy"] == pytest.approx(expected["accuracy"])
    table = evaluated["table"]
    assert "confusion matrix" in table and "macro avg" in table and "shipping" in table


def test_export_gates_the_model_on_its_own_dev_file(work):
    card = (work["out"] / "README.md").read_text()
    line = next(line for line in card.splitlines() if "berth export " in line)
    command = shlex.split(re.search(r"`berth (export [^`]+)`", line).group(1))  # the card's line, as written
    result = berth([*command, "--precision", "int8", "--threads", "1"], work["work"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the parity and task-metric gates read the model's own dev file dev.csv" in result.stderr
    assert "parity gate passed" in result.stderr and "task-metric gate passed" in result.stderr
    bundle = work["work"] / "models" / "my-tickets"
    manifest = json.loads((bundle / "bundle.json").read_text())
    assert Path(manifest["parity"]["data"]).name == "dev.csv"
    assert Path(manifest["parity"]["metric"]["data"]).name == "dev.csv"
    own = manifest["parity"]["metric"]["candidate_metrics"]["accuracy"]
    assert f"| accuracy | {own:.4g} |" in (bundle / "README.md").read_text()  # the int8 bundle's own figure


def test_predict_refuses_a_file_without_the_text_column_before_running(work):
    if not (work["work"] / "models" / "my-tickets").is_dir():
        pytest.skip("needs the exported bundle")
    wrong = work["work"] / "tickets-body.csv"
    wrong.write_text("ticket_id,body\nx-1,my parcel is late\nx-2,refund please\n", encoding="utf-8")
    result = berth(["predict", "models/my-tickets", wrong.name, "--out", "scored.parquet"], work["work"])
    assert result.returncode == 2 and not (work["work"] / "scored.parquet").exists()
    assert result.stderr.strip() == (f"berth predict: input {wrong.name}: no 'text' column; its columns are "
                                     "['ticket_id', 'body'] (name the right one with --text-column)")
    named = berth(["predict", "models/my-tickets", "dev.csv", "--out", "scored.parquet", "--id-column", "id"],
                  work["work"])
    assert named.returncode == 2 and "no 'id' column" in named.stderr
