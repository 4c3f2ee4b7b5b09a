"""`berth sweep` for real: tiny sweeps whose every trial is a real fine-tuning run (a 2-layer, H32 BERT with the real
WordPiece tokenizer, on the topics sample), the grid parser and its refusals, selection and statistics against
values computed here by hand, a failing trial, and SIGKILL mid-sweep then the same command."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from berth.cli import main
from berth.sweep.grid import PRESETS, GridError, expand, parse_grid, size
from berth.sweep.stats import best_cell_by_mean, cell_statistics, select_winner
from tests.training.tiny_training import save_tiny_bert_folder
from training.finetuning.settings import FinetuneSettings

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "data" / "samples" / "topics"


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> Path:
    """A 2-layer H32 BERT (random weights) saved as a model folder with the default base's tokenizer."""
    return save_tiny_bert_folder(tmp_path_factory.mktemp("tiny-base"))


def sweep_args(base: Path, out: Path, *extra: str) -> list[str]:
    return ["sweep", "--task", "classification", "--train", str(SAMPLES / "train.jsonl"),
            "--dev", str(SAMPLES / "dev.jsonl"), "--out", str(out), "--base", str(base),
            "--max-train-examples", "64", "--max-eval-examples", "64", "--max-seq-length", "32",
            "--max-steps", "16", "--batch-size", "8", "--pooling", "mean", "--threads", "2", "--precision", "fp32",
            *extra]


GRID = ["--grid", "lr=1e-2,3e-3", "--restarts", "2"]


def run_cli(capsys, argv: list[str]) -> tuple[int, dict | None, str]:
    code = main(argv)
    captured = capsys.readouterr()
    document = json.loads(captured.out) if captured.out.strip() else None  # the whole stdout: one document
    return code, document, captured.err


@pytest.fixture(scope="module")
def uninterrupted(tiny_base, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / "run"
    done = subprocess.run([sys.executable, "-m", "berth.cli", *sweep_args(tiny_base, out, *GRID)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)  # stdout is one JSON document, nothing else
    assert document["sweep"] == str(out / "sweep.json")
    return out


# --- the grid ------------------------------------------------------------------------------------------------


def test_grid_parsing_types_and_orders_the_cells():
    grid = parse_grid(["lr=5e-5,3e-5,2e-5", "batch_size=16,32", "epochs=2,3,4"])
    assert list(grid) == ["learning_rate", "batch_size", "epochs"] and size(grid) == 18
    base = FinetuneSettings(task="classification", train_file="t.tsv", out="o")
    cells = expand(base, grid)
    assert len(cells) == 18
    assert cells[0] == {"learning_rate": 5e-5, "batch_size": 16, "epochs": 2.0}
    assert cells[1] == {"learning_rate": 5e-5, "batch_size": 16, "epochs": 3.0}
    assert cells[-1] == {"learning_rate": 2e-5, "batch_size": 32, "epochs": 4.0}
    assert isinstance(cells[0]["batch_size"], int) and isinstance(cells[0]["learning_rate"], float)


def test_presets_are_the_published_grids():
    # BERT paper, appendix A.3; GLUE section 4.1; Google's small-BERT release README.
    assert parse_grid(["paper"]) == {"learning_rate": [5e-5, 3e-5, 2e-5], "batch_size": [16, 32], "epochs": [2, 3, 4]}
    assert parse_grid(["paper-glue"]) == {"learning_rate": [5e-5, 4e-5, 3e-5, 2e-5], "batch_size": [32],
                                          "epochs": [3]}
    assert size(PRESETS["small-bert"]) == 20 and PRESETS["small-bert"]["batch_size"] == [8, 16, 32, 64, 128]
    replaced = parse_grid(["paper", "lr=1e-4", "warmup_ratio=0,0.1"])
    assert replaced["learning_rate"] == ["1e-4"] and replaced["batch_size"] == [16, 32]
    assert replaced["warmup_ratio"] == ["0", "0.1"]


@pytest.mark.parametrize("items, message", [
    (["dropout=0.1"], "unknown grid key 'dropout'"),
    (["seed=1,2"], "not swept (use --restarts"),
    (["lr="], "has no values"),
    (["lr=1e-4,1e-4"], "repeats a value"),
    (["paperz"], "neither key=v1,v2 nor a preset"),
    ([], "empty grid"),
])
def test_grid_refusals(items, message):
    with pytest.raises(GridError, match=message.replace("(", r"\(")):
        parse_grid(items)


def test_bad_values_are_refused_with_the_settings_message():
    base = FinetuneSettings(task="classification", train_file="t.tsv", out="o")
    with pytest.raises(GridError, match="learning_rate=abc: learning_rate: Input should be a valid number"):
        expand(base, parse_grid(["lr=1e-4,abc"]))
    with pytest.raises(GridError, match="batch_size=0: batch_size: Input should be greater than 0"):
        expand(base, parse_grid(["batch_size=0"]))


@pytest.mark.parametrize("extra, message", [
    (["--grid", "dropout=0.1"], "unknown grid key 'dropout'"),
    (["--grid", "lr=fast"], "Input should be a valid number"),
    (["--grid", "lr="], "has no values"),
    (["--grid", "paper", "--restarts", "3"], "54 trials (18 cells x 3 restarts) is more than --max-trials 48"),
    (["--sweep-minutes", "1", "--max-minutes", "5"], "cannot fit one trial"),
    (["--restarts", "0"], "--restarts 0"),
])
def test_bad_input_is_one_line_and_exit_2_before_training(tmp_path, capsys, tiny_base, extra, message):
    out = tmp_path / "never"
    code, document, err = run_cli(capsys, sweep_args(tiny_base, out, *extra))
    assert code == 2 and document is None
    assert err.count("\n") == 1 and err.startswith("berth sweep: ") and message in err
    assert not out.exists()  # refused before anything was written or trained


def test_a_sweep_needs_a_dev_set(tmp_path, capsys, tiny_base):
    argv = [a for a in sweep_args(tiny_base, tmp_path / "o") if a not in ("--dev", str(SAMPLES / "dev.jsonl"))]
    code, _, err = run_cli(capsys, argv)
    assert code == 2 and "give --dev" in err


# --- selection and statistics on planted records ---------------------------------------------------------------


def planted() -> tuple[list[dict], list[dict]]:
    cells = [{"learning_rate": 1e-4}, {"learning_rate": 5e-5}, {"learning_rate": 3e-5}]
    values = {(0, 1): 0.70, (1, 1): 0.80, (2, 1): 0.60, (0, 2): 0.74, (1, 2): None, (2, 2): 0.80,
              (0, 3): 0.72, (1, 3): 0.78, (2, 3): float("nan")}
    trials = []
    for seed in (1, 2, 3):
        for cell in range(3):
            value = values[(cell, seed)]
            status = "failed" if value is None else "ok"
            trials.append({"id": f"c{cell}-s{seed}", "cell": cell, "seed": seed, "status": status,
                           "dev_metrics": {} if value is None else {"accuracy": value}})
    return trials, cells


def test_selection_and_statistics_against_hand_computed_values():
    trials, cells = planted()
    winner = select_winner(trials, "accuracy")
    # 0.80 twice (c1-s1 first in trial order, c2-s2 later): a tie, reported, the earlier trial wins.
    assert (winner["id"], winner["value"], winner["ties"]) == ("c1-s1", 0.80, ["c2-s2"])
    stats = cell_statistics(trials, cells, "accuracy")
    first, second, third = stats
    assert first["mean"] == pytest.approx(0.72) and first["std"] == pytest.approx(0.02)  # (.70,.74,.72)
    assert (first["min"], first["max"], first["best"]["id"]) == (0.70, 0.74, "c0-s2")
    # one failed restart: counted, not dropped; mean/std over the two ok ones; sqrt(0.0002) = 0.01414
    assert (second["ok"], second["failed"]) == (2, 1)
    assert second["mean"] == pytest.approx(0.79) and second["std"] == pytest.approx(math.sqrt(0.0002))
    # a NaN metric is not a value: one ok value left, no std
    assert third["values"] == [0.60, 0.80] and third["mean"] == pytest.approx(0.70)
    assert best_cell_by_mean(stats)["cell"] == 1


# --- real sweeps -----------------------------------------------------------------------------------------------


def trial_metrics_from_folders(out: Path) -> dict[str, float]:
    """Each trial's dev accuracy as its own fine-tuning run recorded it (berth_task.json), not the sweep."""
    found = {}
    for task_file in (out / "trials").glob("*/berth_task.json"):
        found[task_file.parent.name] = json.loads(task_file.read_text())["dev_metrics"]["accuracy"]
    return found


def test_sweep_record_winner_and_best_folder(uninterrupted):
    record = json.loads((uninterrupted / "sweep.json").read_text())
    assert record["metric"] == "accuracy" and record["counts"] == {"ok": 4, "failed": 0, "not_run": 0}
    assert [t["id"] for t in record["trials"]] == ["c00-seed42", "c01-seed42", "c00-seed43", "c01-seed43"]
    assert [t["settings"]["learning_rate"] for t in record["trials"]] == [1e-2, 3e-3, 1e-2, 3e-3]
    for trial in record["trials"]:
        assert trial["status"] == "ok" and trial["minutes"] > 0 and trial["steps"] == 16
    accuracies = trial_metrics_from_folders(uninterrupted)
    assert len(accuracies) == 4
    best = max(accuracies.values())
    assert len(set(accuracies.values())) > 1  # the trials differ: the choice means something
    order = [t["id"] for t in record["trials"]]
    expected = min((key for key, value in accuracies.items() if value == best), key=order.index)
    assert record["winner"]["id"] == expected and record["winner"]["value"] == best
    # each trial's learning rate really reached its run
    for trial in record["trials"]:
        run = json.loads((uninterrupted / "trials" / trial["id"] / "finetune_run.json").read_text())
        assert run["settings"]["learning_rate"] == trial["settings"]["learning_rate"]
        assert run["settings"]["seed"] == trial["seed"]
    # per-cell statistics from the folders' numbers
    for cell in record["cells"]:
        values = [accuracies[f"c{cell['cell']:02d}-seed{seed}"] for seed in (42, 43)]
        assert cell["mean"] == pytest.approx(sum(values) / 2)
        assert cell["std"] == pytest.approx(abs(values[0] - values[1]) / math.sqrt(2))
    # the winner's weights are kept as best/, the others' are gone
    best_folder = uninterrupted / "best"
    assert json.loads((best_folder / "sweep_trial.json").read_text())["id"] == expected
    assert (best_folder / "model.safetensors").read_bytes() == \
        (uninterrupted / "trials" / expected / "model.safetensors").read_bytes()
    kept = sorted(p.parent.name for p in (uninterrupted / "trials").glob("*/model.safetensors"))
    assert kept == [expected]
    assert (best_folder / "berth_task.json").is_file() and (best_folder / "tokenizer.json").is_file()


def test_a_finished_sweep_run_again_reruns_nothing(uninterrupted, capsys, tiny_base):
    before = {p.parent.name: p.read_text() for p in (uninterrupted / "trials").glob("*/trial.json")}
    code, document, _ = run_cli(capsys, sweep_args(tiny_base, uninterrupted, *GRID))
    assert code == 0 and document["counts"]["ok"] == 4
    after = {p.parent.name: p.read_text() for p in (uninterrupted / "trials").glob("*/trial.json")}
    assert after == before


def test_another_sweep_in_the_same_folder_is_refused(uninterrupted, capsys, tiny_base):
    code, _, err = run_cli(capsys, sweep_args(tiny_base, uninterrupted, "--grid", "lr=5e-4", "--restarts", "2"))
    assert code == 2 and err.count("\n") == 1 and "holds another sweep (different cells, grid)" in err


def test_sigkill_mid_sweep_then_the_same_command_finishes_every_trial_once(uninterrupted, tiny_base, tmp_path):
    out = tmp_path / "killed"
    argv = [sys.executable, "-m", "berth.cli", *sweep_args(tiny_base, out, *GRID, "--save-every-steps", "1")]
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while len(list((out / "trials").glob("*/trial.json"))) < 2:
            assert process.poll() is None and time.monotonic() < deadline, "the sweep ended before the kill"
            time.sleep(0.2)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait()
    first = {p.parent.name: json.loads(p.read_text()) for p in (out / "trials").glob("*/trial.json")}
    assert 2 <= len(first) < 4
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{len(first)} of 4 trials already finished, not re-run" in done.stderr
    record = json.loads((out / "sweep.json").read_text())
    assert record["counts"] == {"ok": 4, "failed": 0, "not_run": 0}
    for trial in record["trials"]:  # the finished ones were not run again
        if trial["id"] in first:
            assert trial["started_at"] == first[trial["id"]]["started_at"]
    reference = json.loads((uninterrupted / "sweep.json").read_text())
    assert {t["id"]: t["dev_metrics"] for t in record["trials"]} == \
        {t["id"]: t["dev_metrics"] for t in reference["trials"]}
    assert record["winner"]["id"] == reference["winner"]["id"]


def test_a_failing_trial_is_recorded_and_the_sweep_goes_on(tmp_path, tiny_base, capsys, monkeypatch):
    import training.finetuning.finetune

    real = training.finetuning.finetune.run_finetune

    def crash_on_one(settings):
        if settings.seed == 42 and settings.learning_rate == 1e-3:
            raise RuntimeError("out of memory (planted)")
        return real(settings)

    monkeypatch.setattr(training.finetuning.finetune, "run_finetune", crash_on_one)
    out = tmp_path / "failing"
    code, document, _ = run_cli(capsys, sweep_args(tiny_base, out, "--grid", "lr=1e-3,1e9,5e-4"))
    record = json.loads((out / "sweep.json").read_text())
    statuses = {t["id"]: (t["status"], t.get("error")) for t in record["trials"]}
    assert statuses["c00-seed42"] == ("failed", "RuntimeError: out of memory (planted)")
    # lr 1e9: a real run whose weights blow up; the loop stops at the first non-finite loss, the trial is failed
    assert statuses["c01-seed42"][0] == "failed"
    assert statuses["c01-seed42"][1].startswith("TrainingDiverged: training diverged at step ")
    assert statuses["c02-seed42"] == ("ok", None)
    assert record["counts"] == {"ok": 1, "failed": 2, "not_run": 0}
    assert code == 0 and document["winner"]["id"] == "c02-seed42" == record["winner"]["id"]
    assert [(c["ok"], c["failed"]) for c in record["cells"]] == [(0, 1), (0, 1), (1, 0)]


def test_a_spent_budget_stops_the_sweep_after_whole_trials(tmp_path, capsys, tiny_base):
    out = tmp_path / "budget"
    code, document, _ = run_cli(capsys, sweep_args(tiny_base, out, *GRID, "--sweep-minutes", "0.0001"))
    record = json.loads((out / "sweep.json").read_text())
    # the first trial starts (nothing spent yet), then the budget is gone: the rest are listed as not run
    assert [t["status"] for t in record["trials"]] == ["ok", "not_run", "not_run", "not_run"]
    assert record["stopped_by"] == "sweep_minutes" and document["stopped_by"] == "sweep_minutes"
    assert code == 0 and record["cells"][1]["not_run"] == 2


def test_restart_major_order_gives_every_cell_a_trial_first():
    from berth.sweep.run import SweepPlan

    settings = FinetuneSettings(task="classification", train_file="t.tsv", out="o")
    plan = SweepPlan(settings=settings, grid={"learning_rate": [1, 2, 3]}, cells=[{}, {}, {}], seeds=[7, 8])
    assert plan.order() == [(0, 7), (1, 7), (2, 7), (0, 8), (1, 8), (2, 8)]


def test_grid_and_restarts_from_a_config_file(tmp_path, capsys, tiny_base):
    config = tmp_path / "sweep.yaml"
    config.write_text("grid:\n  lr: [1.0e-2, 3.0e-3]\nrestarts: 1\nlearning_rate: 5.0e-5\nmax_steps: 2\n")
    out = tmp_path / "from-config"
    code, document, _ = run_cli(capsys, sweep_args(tiny_base, out, "--config", str(config), "--max-steps", "2"))
    assert code == 0
    record = json.loads((out / "sweep.json").read_text())
    assert record["grid"] == {"learning_rate": [1e-2, 3e-3]} and record["seeds"] == [42]
    assert [t["settings"] for t in record["trials"]] == [{"learning_rate": 1e-2}, {"learning_rate": 3e-3}]
    bad = tmp_path / "bad.yaml"
    bad.write_text("grid:\n  lr: [fast]\n")
    code, _, err = run_cli(capsys, sweep_args(tiny_base, tmp_path / "never", "--config", str(bad)))
    assert code == 2 and "valid number" in err and not (tmp_path / "never").exists()


def test_report_and_plot_of_a_sweep(uninterrupted, capsys):
    from berth.sweep.report import markdown

    record = json.loads((uninterrupted / "sweep.json").read_text())
    table = markdown(record)
    rows = [line for line in table.splitlines() if line.startswith("| 0.")]
    assert len(rows) == 2 and "2 / 2" in rows[0]
    cell = record["cells"][0]
    assert f"{cell['mean'] * 100:.1f} ± {cell['std'] * 100:.1f}" in rows[0]
    assert f"`{record['winner']['id']}`" in table
    assert main(["plot", str(uninterrupted)]) == 0
    png = uninterrupted / "sweep.png"
    assert capsys.readouterr().out.strip() == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_loss_is_selected_lowest():
    trials = [{"id": f"t{i}", "cell": i, "seed": 1, "status": "ok", "dev_metrics": {"loss": v}}
              for i, v in enumerate([0.9, 0.4, 0.7])]
    cells = [{"x": i} for i in range(3)]
    assert select_winner(trials, "loss", greater=False)["id"] == "t1"
    assert best_cell_by_mean(cell_statistics(trials, cells, "loss", greater=False), greater=False)["cell"] == 1


def test_the_winner_exported_to_a_bundle(uninterrupted, capsys, tiny_base, tmp_path):
    bundle = tmp_path / "bundle"
    code, document, _ = run_cli(capsys, sweep_args(tiny_base, uninterrupted, *GRID, "--export", str(bundle)))
    assert code == 0 and document["export"]["exit_code"] == 0
    manifest = json.loads((bundle / "bundle.json").read_text())
    record = json.loads((uninterrupted / "sweep.json").read_text())
    assert manifest["source"]["dev_metrics"]["accuracy"] == record["winner"]["value"]


def test_best_of_seeds_is_a_one_cell_sweep(tmp_path, tiny_base):
    from berth.sweep.run import best_of_seeds
    from training.finetuning.finetune import FinetuneSettings

    settings = FinetuneSettings(task="classification", train_file=SAMPLES / "train.jsonl",
                                dev_file=SAMPLES / "dev.jsonl", out=tmp_path / "unused", base=str(tiny_base),
                                max_train_examples=64, max_eval_examples=64, max_seq_length=32, max_steps=16,
                                batch_size=8, pooling="mean", learning_rate=3e-3, num_threads=2, precision="fp32")
    record = best_of_seeds(settings, [42, 43], tmp_path / "seeds")
    accuracies = trial_metrics_from_folders(tmp_path / "seeds")
    assert sorted(accuracies) == ["c00-seed42", "c00-seed43"]
    best = max(accuracies.values())
    assert record["winner"]["value"] == best and accuracies[record["winner"]["id"]] == best
    assert record["cells"][0]["ok"] == 2 and (tmp_path / "seeds" / "best" / "model.safetensors").is_file()


def test_a_bad_row_stops_the_sweep_in_one_line(tmp_path, tiny_base, capsys):
    train = tmp_path / "train.jsonl"
    rows = (SAMPLES / "train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:10]
    train.write_text("".join(rows[:3]) + '{"text": "cut short\n' + "".join(rows[3:]), encoding="utf-8")
    argv = sweep_args(tiny_base, tmp_path / "bad", *GRID)
    argv[argv.index("--train") + 1] = str(train)
    code, document, err = run_cli(capsys, argv)
    assert code == 2 and document is None
    assert err.strip().splitlines()[-1] == f"berth sweep: {train}:4: invalid JSON: Invalid control character at " \
                                           "(character 20)"
    assert not list((tmp_path / "bad").glob("trials/*/trial.json"))  # no trial recorded as if it had run
