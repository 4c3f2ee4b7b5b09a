"""`berth build-defaults`: the embedded base exported as the `embeddings` bundle (no training), once; the
recipes' minute budgets sizing the data by the measured speed."""

from __future__ import annotations

import pytest

from berth.build_defaults import SAMPLE_RECIPES, default_examples, training_sizing
from berth.cli import main
from tasks.bundle_checks import load_bundle
from training.loop.trainer import steps_within_budget


@pytest.mark.slow
def test_build_defaults_only_embeddings_exports_the_base_once(tmp_path, capsys):
    out = tmp_path / "models"
    assert main(["build-defaults", "--only", "embeddings", "--out", str(out), "--work", str(tmp_path / "work"),
                 "--threads", "2"]) == 0
    bundle = load_bundle(out / "embeddings")
    assert bundle.task == "embedding" and bundle.precision == "fp32" and bundle.parity["passed"]
    assert bundle.task_settings["pooling"] == "mean" and bundle.task_settings["normalize"] is True
    assert bundle.task_settings["max_seq_length"] == 256
    assert [o.name for o in bundle.outputs] == ["sentence_embedding", "hidden_states"]
    assert bundle.examples == default_examples()["embeddings"]  # the playground's examples
    assert not (tmp_path / "work").exists()  # nothing was fine-tuned
    capsys.readouterr()
    main(["build-defaults", "--only", "embeddings", "--out", str(out), "--work", str(tmp_path / "work")])
    assert "bundle exists, skipped" in capsys.readouterr().err


def test_a_minute_budget_sizes_the_run_by_the_measured_speed():
    # squad's plan: 11,769 questions, batch 16, one epoch = 736 steps; a 5-minute budget, 20 s spent.
    planned, left = 736, 5 * 60 - 20
    slow = steps_within_budget(step=10, steps_per_s=0.5, remaining_s=left, planned_steps=planned)
    fast = steps_within_budget(step=10, steps_per_s=2.0, remaining_s=left, planned_steps=planned)
    faster = steps_within_budget(step=10, steps_per_s=4.0, remaining_s=left, planned_steps=planned)
    assert (slow, fast, faster) == (10 + 140, 10 + 560, planned)  # more data on a faster CPU, never past the plan
    assert steps_within_budget(step=10, steps_per_s=2.0, remaining_s=-5, planned_steps=planned) == 10
    # A minimum (the examples the slowest CPU trains on within the budget) holds on a busy machine.
    assert steps_within_budget(step=10, steps_per_s=0.5, remaining_s=left, planned_steps=planned, min_steps=282) == 282
    assert steps_within_budget(step=10, steps_per_s=0.5, remaining_s=left, planned_steps=200, min_steps=282) == 200


def _run_record(epochs: float, steps: int, planned: int, stopped_by: str = "steps") -> dict:
    return {"settings": {"max_minutes": 5}, "train_examples": 11769, "train_minutes": 4.9, "precision": "bf16",
            "train_result": {"epochs": epochs}, "speed": {"examples_per_s": 24.0, "threads": 2},
            "schedule": {"planned_steps": planned, "steps": steps, "fitted_to_budget": steps != planned,
                         "stopped_by": stopped_by}}


def test_the_build_record_says_how_much_data_a_model_saw_and_why():
    fitted = training_sizing(_run_record(epochs=0.6, steps=442, planned=736))
    assert (fitted["examples_seen"], fitted["distinct_examples"], fitted["shipped_examples"]) == (7061, 7061, 11769)
    assert fitted["why"].startswith("the 5-minute budget at 24.0 examples/s (bf16, 2 threads) fits 442 of the 736")
    slow = _run_record(epochs=0.38, steps=282, planned=736)
    slow["settings"]["min_steps"], slow["train_minutes"] = 282, 7.5
    assert training_sizing(slow)["why"].startswith("the minimum of 282 steps (4,472 examples, 0.38 epochs of 11,769)")
    whole = training_sizing(_run_record(epochs=2.0, steps=1472, planned=1472))
    assert (whole["examples_seen"], whole["distinct_examples"]) == (23538, 11769)
    assert whole["why"].startswith("every example, 2 epoch(s) of 11,769")


def test_every_default_recipe_has_a_training_budget_inside_its_minutes_and_the_build_fits_20_minutes():
    for recipe in SAMPLE_RECIPES:
        assert 0 < recipe.options["max_minutes"] < recipe.minutes, recipe.name
    assert sum(r.minutes for r in SAMPLE_RECIPES) <= 19  # plus well under a minute for the embeddings export
