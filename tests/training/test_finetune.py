"""`berth finetune` / `berth evaluate` end to end on small slices of real data, from the real checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from berth.cli import main
from tasks.runtime.spec import TaskSpec
from training.finetuning.evaluate import evaluate_model
from training.finetuning.finetune import FinetuneSettings, run_finetune

SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples"


def _finetune(tmp_path, task, train, dev, **options) -> tuple[Path, dict]:
    out = tmp_path / task
    options = {"epochs": 1, "batch_size": 8, "precision": "fp32", **options}  # the quality floors are fp32 runs
    settings = FinetuneSettings(task=task, train_file=SAMPLES / train, dev_file=SAMPLES / dev, out=out, threads=2,
                                **options)
    return out, run_finetune(settings)


def test_classification_learns_and_saves_a_servable_folder(tmp_path):
    out, metrics = _finetune(tmp_path, "classification", "topics/train.jsonl", "topics/dev.jsonl",
                             max_train_examples=400, max_eval_examples=100, max_seq_length=48, learning_rate=1e-4)
    spec = TaskSpec.load(out)
    assert spec.labels == ["arts_media", "people", "places", "science_tech", "society"]
    assert spec.dev_metrics == metrics
    assert metrics["accuracy"] > 0.4  # five balanced classes: chance is 0.2
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "finetune_run.json"):
        assert (out / name).is_file(), name
    config = json.loads((out / "config.json").read_text())
    # mean-pooled (below): saved with its own model type and code, which transformers loads only with
    # trust_remote_code (tests/training/test_hf_layout.py)
    assert config["id2label"]["0"] == "arts_media" and config["model_type"] == "berth_mean_pooled_bert"
    assert config["architectures"] == ["BerthMeanPooledBertForSequenceClassification"]
    again = evaluate_model(out, SAMPLES / "topics/dev.jsonl", limit=100)
    assert again["accuracy"] == pytest.approx(metrics["accuracy"])
    # The default base was trained with mean pooling: the head uses it, and says so.
    assert spec.pooling == "mean" and config["classifier_pooling"] == "mean"
    record = json.loads((out / "finetune_run.json").read_text())
    assert len(record["provenance"]["git_revision"]) >= 40 and record["provenance"]["libraries"]["torch"]
    assert record["speed"]["threads"] == 2 and record["speed"]["examples_per_s"] > 0
    assert record["speed"]["padded_over_real_tokens"] >= 1.0


def test_pair_regression(tmp_path):
    out, metrics = _finetune(tmp_path, "pair", "stsb/train.jsonl", "stsb/dev.jsonl", regression=True,
                             max_train_examples=400, max_eval_examples=100, max_seq_length=48, learning_rate=2e-4,
                             epochs=3, batch_size=16)
    assert TaskSpec.load(out).problem_type == "regression"
    assert {"pearson", "spearman"} <= set(metrics)
    assert metrics["pearson"] > 0.3  # untrained: about 0.2 or below


def test_ner_on_wikigold_and_btc(tmp_path):
    out, metrics = _finetune(tmp_path, "ner", "entities/train.conll", "entities/dev.conll",
                             max_train_examples=200, max_eval_examples=100, max_seq_length=64, learning_rate=1e-4)
    spec = TaskSpec.load(out)
    assert spec.labels[0] == "O" and {"B-PER", "I-PER", "B-LOC", "B-ORG"} <= set(spec.labels)
    assert spec.doc_stride < spec.max_seq_length - 2  # servable overlap for long texts
    assert {"precision", "recall", "f1"} <= set(metrics)


def test_qa_on_squad_windows(tmp_path):
    out, metrics = _finetune(tmp_path, "qa", "squad/train.json", "squad/dev.json", max_train_examples=400,
                             max_eval_examples=40, max_seq_length=192, doc_stride=64, learning_rate=1e-4)
    spec = TaskSpec.load(out)
    assert spec.max_seq_length == 192 and spec.doc_stride == 64 and not spec.version_2_with_negative
    assert {"exact", "f1", "total"} <= set(metrics) and metrics["total"] == 40
    assert metrics["f1"] > 5  # a few minutes of CPU cannot do much; it must beat an untrained head (~0-12)


def test_cli_help_lists_working_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for command in ("finetune", "evaluate", "tokenizer"):
        assert command in text


def test_multiple_choice_on_swag_csv_saves_a_transformers_folder(tmp_path):
    swag = Path(__file__).resolve().parents[1] / "tasks" / "data" / "swag_sample.csv"
    out = tmp_path / "swag"
    metrics = run_finetune(FinetuneSettings(task="multiple-choice", train_file=swag, dev_file=swag, out=out,
                                            threads=2, epochs=1, batch_size=2, max_seq_length=32, precision="fp32"))
    spec = TaskSpec.load(out)
    assert spec.task == "multiple-choice" and spec.extra["num_choices"] == 4 and set(metrics) == {"accuracy"}
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForMultipleChoice"]
    transformers = pytest.importorskip("transformers")
    import torch

    from tasks import multiple_choice

    hf = transformers.BertForMultipleChoice.from_pretrained(str(out)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    examples = multiple_choice.read_swag(swag)
    predicted = []
    for example in examples:
        encoded = tokenizer([example.context] * 4, example.choices, padding=True, truncation=True, max_length=32,
                            return_tensors="pt")
        with torch.no_grad():
            predicted.append(int(hf(**{k: v[None] for k, v in encoded.items()}).logits.argmax()))
    assert metrics["accuracy"] == pytest.approx(multiple_choice.accuracy(predicted, [e.label for e in examples]))
    assert evaluate_model(out, swag)["accuracy"] == pytest.approx(metrics["accuracy"])
