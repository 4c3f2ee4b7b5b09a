"""The research recipes' restarts (best of seeds), base from another recipe, and the SQuAD v2.0 split."""

from __future__ import annotations

import json

import pytest

from berth import build_defaults
from berth.build_defaults import SHARED_RECIPES, Recipe
from training.finetuning.squad_v2_split import split_squad_v2


def _questions(articles):
    return [q for a in articles for p in a["paragraphs"] for q in p["qas"]]


def test_squad_v2_split_keeps_articles_apart_and_borrows_unanswerable_questions(shared_data, tmp_path):
    source = shared_data / "squad" / "v2.0" / "dev-v2.0.derived.json"
    v1 = shared_data / "squad" / "v1.1" / "train-v1.1-subset-44articles.json"
    articles = json.loads(source.read_text())["data"]
    split_squad_v2(source, tmp_path, train_articles=18, unanswerable_from=v1, unanswerable=200, seed=7)
    train = json.loads((tmp_path / "squad-v2-train.json").read_text())["data"]
    evaluation = json.loads((tmp_path / "squad-v2-eval.json").read_text())["data"]
    assert [a["title"] for a in train] == [a["title"] for a in articles[:18]]
    assert evaluation == articles[18:]  # the evaluation part is the official data, untouched
    own = _questions(articles[:18])
    added = [q for q in _questions(train) if q["id"].startswith("borrowed-")]
    assert len(_questions(train)) == len(own) + 200 and len(added) == 200
    assert all(q["is_impossible"] and q["answers"] == [] for q in added)
    v1_questions = {q["id"]: q["question"] for q in _questions(json.loads(v1.read_text())["data"])}
    assert all(v1_questions[q["id"].removeprefix("borrowed-")] == q["question"] for q in added)
    again = tmp_path / "again"
    split_squad_v2(source, again, train_articles=18, unanswerable_from=v1, unanswerable=200, seed=7)
    assert (again / "squad-v2-train.json").read_bytes() == (tmp_path / "squad-v2-train.json").read_bytes()


def test_shared_recipes_name_what_they_depend_on():
    names = [r.name for r in SHARED_RECIPES]
    for position, recipe in enumerate(SHARED_RECIPES):
        if recipe.start_from:  # built earlier in the same run
            assert recipe.start_from in names[:position]
        if recipe.prepare:
            assert recipe.prepare in build_defaults.DERIVED_DATA
        if recipe.seeds:
            assert recipe.select and len(set(recipe.seeds)) == len(recipe.seeds)


def test_best_of_seeds_keeps_the_run_with_the_best_dev_metric(shared_data, tmp_path):
    recipe = Recipe("mrpc", "pair", "mrpc/train.tsv", "mrpc/dev.tsv",
                    {"max_train_examples": 48, "max_eval_examples": 40, "max_steps": 3, "batch_size": 16,
                     "max_seq_length": 64, "learning_rate": 1e-4}, seeds=(1, 2), select="accuracy")
    folder, metrics, quality = build_defaults._train_to_floor(recipe, shared_data, tmp_path, 2, "[test]")
    trials = tmp_path / "mrpc-seeds" / "trials"  # a one-cell sweep, one trial per seed
    runs = {seed: json.loads((trials / f"c00-seed{seed}" / "finetune_run.json").read_text()) for seed in (1, 2)}
    assert {seed: run["settings"]["seed"] for seed, run in runs.items()} == {1: 1, 2: 2}
    best = max((1, 2), key=lambda seed: runs[seed]["dev_metrics"]["accuracy"])
    assert quality["seed"] == best and metrics == runs[best]["dev_metrics"]
    assert folder == tmp_path / "mrpc"
    kept = json.loads((folder / "finetune_run.json").read_text())
    assert kept["settings"]["seed"] == best and not (folder / "train_state").exists()
    record = json.loads((folder / "sweep.json").read_text())  # the build's record is the sweep's
    assert record["winner"]["seed"] == best and record["metric"] == "accuracy" and record["counts"]["ok"] == 2
    assert [trial["seed"] for trial in record["trials"]] == [1, 2]


def test_a_recipe_whose_base_is_missing_says_which_to_build_first(shared_data, tmp_path):
    recipe = next(r for r in SHARED_RECIPES if r.start_from)
    with pytest.raises(SystemExit, match=f"build {recipe.start_from} first"):
        build_defaults._train_to_floor(recipe, shared_data, tmp_path, 2, "[test]")
