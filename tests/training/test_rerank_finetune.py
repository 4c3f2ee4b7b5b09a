"""`berth finetune --task rerank` end to end on a small slice of the shipped SQuAD samples, from the real
checkpoint: it trains, saves a servable folder, exports int8 through the parity and metric gates, and the
bundle evaluates as the PyTorch model does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.rerank import read_article_questions
from tasks.runtime.spec import TaskSpec
from training.finetuning.evaluate import evaluate_model
from training.finetuning.finetune import FinetuneSettings, run_finetune

SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples"
DEV_QUESTIONS = 12


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("rerank") / "model"
    settings = FinetuneSettings(task="rerank", train_file=SAMPLES / "squad/train.json",
                                dev_file=SAMPLES / "squad/dev.json", out=out, max_train_examples=240,
                                max_eval_examples=DEV_QUESTIONS, negatives=2, epochs=1, batch_size=8,
                                max_seq_length=96, learning_rate=1e-4, threads=2, precision="fp32")
    return out, run_finetune(settings)


def test_a_rerank_head_trains_and_ranks_the_right_paragraph_higher(trained):
    out, metrics = trained
    spec = TaskSpec.load(out)
    assert spec.task == "rerank" and spec.max_seq_length == 96 and spec.doc_stride == 24
    assert spec.dev_metrics == metrics and metrics["queries"] == DEV_QUESTIONS
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BerthMeanPooledBertForSequenceClassification"] and config["num_labels"] == 1
    assert config["classifier_pooling"] == "mean"
    # A random order of these questions' 23-45 paragraphs has an MRR@10 of about 0.1.
    candidates = [len(e.documents) for e in read_article_questions(SAMPLES / "squad/dev.json")[:DEV_QUESTIONS]]
    assert min(candidates) >= 23
    assert metrics["mrr_at_10"] > 0.3
    record = json.loads((out / "finetune_run.json").read_text())
    assert record["train_examples"] == 240 and record["schedule"]["steps"] == 30


@pytest.mark.slow  # exports and gates fp32 and int8 rerank bundles: over 2 minutes
def test_the_bundles_are_gated_on_the_ranking_and_evaluate_as_pytorch(trained, tmp_path):
    """fp32 evaluates as PyTorch did; int8 is gated on MRR@10 over the dev questions: a model trained for 30 steps
    has near-tied paragraphs, so int8 may pass or be refused, but the gate must have scored the ranking."""
    from export.bundle_builder import export_bundle
    from export.parity import ParityError
    from export.settings import ExportSettings
    from tasks.bundle_checks import load_bundle

    out, metrics = trained
    examples = [{"query": "Who designed the bridge?",
                 "documents": ["It opened in 2005.", "Sofia Lindqvist designed it."]}]
    export_bundle(ExportSettings(model_folder=out, out=tmp_path / "fp32", precision="fp32", parity_examples=8,
                                 optimize="never"), example_inputs=examples)
    dev = SAMPLES / "squad/dev.json"
    fp32_metrics = evaluate_model(tmp_path / "fp32", dev, limit=DEV_QUESTIONS)
    assert fp32_metrics["mrr_at_10"] == pytest.approx(metrics["mrr_at_10"])
    assert fp32_metrics["top1"] == pytest.approx(metrics["top1"])
    assert load_bundle(tmp_path / "fp32").examples == examples
    try:
        export_bundle(ExportSettings(model_folder=out, out=tmp_path / "int8", precision="int8", parity_examples=8,
                                     metric_examples=DEV_QUESTIONS, optimize="never"))
    except ParityError as error:
        assert "task-metric gate FAILED" in str(error) and "mrr_at_10" in str(error), str(error)  # the ranking scored
        _reference_is_the_finetune_evaluation(error.report["metric"], metrics)
        return
    int8 = load_bundle(tmp_path / "int8")
    _reference_is_the_finetune_evaluation(int8.parity["metric"], metrics)
    assert int8.parity["passed"] and int8.parity["metric"]["name"] == "mrr_at_10" and int8.parity["metric"]["passed"]


def _reference_is_the_finetune_evaluation(gate: dict, metrics: dict) -> None:
    """The gate's PyTorch reference on the same dev questions came from the outputs the finetune run kept
    (dev_outputs.npz), and is the finetune run's own MRR@10."""
    assert gate["reference_outputs"] == "the checkpoint's dev evaluation"
    assert gate["reference"] == pytest.approx(round(100 * metrics["mrr_at_10"], 3))


def test_a_fine_tuned_mean_pooled_folder_is_a_base_and_starts_with_its_weights(trained, tmp_path):
    """A reranker may start from a model already trained on pairs (another berth fine-tuned, mean-pooled folder,
    model_type berth_mean_pooled_bert): its encoder and its one-logit head are loaded, not re-initialized."""
    from safetensors.torch import load_file

    from training.bert.checkpoint import checkpoint_problem

    base, _ = trained
    assert checkpoint_problem(base) is None
    out = tmp_path / "again"
    run_finetune(FinetuneSettings(task="rerank", train_file=SAMPLES / "squad/train.json", out=out, base=str(base),
                                  max_train_examples=8, negatives=2, max_steps=1, batch_size=8, max_seq_length=96,
                                  learning_rate=1e-9, warmup_ratio=0.0, threads=2, precision="fp32"))
    before, after = load_file(str(base / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert before.keys() == after.keys() and any(key.startswith("classifier") for key in after)
    for key, weight in before.items():  # one step of 1e-9 moves no weight by more than ~1e-8
        assert (after[key] - weight).abs().max().item() < 1e-6, key
