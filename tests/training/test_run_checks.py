"""finetune's warnings before training, on real examples read by the real readers: a run too short for its data
(with the epochs that would fix it), and dev labels or NER types that training never saw."""

from __future__ import annotations

from pathlib import Path

from tasks import readers
from training.finetuning.run_checks import MIN_STEPS, short_run, unseen_dev_labels
from training.finetuning.settings import FinetuneSettings
from training.loop.trainer import Plan


def settings(**values) -> FinetuneSettings:
    return FinetuneSettings(task="classification", train_file=Path("train.csv"), out=Path("out"), **values)


def plan_of(s: FinetuneSettings, examples: int) -> Plan:
    return Plan.make(s.loop_settings(Path("out")), examples, 1)


def test_the_defaults_on_a_few_hundred_rows_are_a_short_run_and_the_advice_fixes_it():
    s = settings()  # 3 epochs of batch 32
    plan = plan_of(s, 300)
    assert (plan.steps_per_epoch, plan.total_steps) == (10, 30)
    warning = short_run(plan.total_steps, plan.steps_per_epoch, s)
    assert warning.startswith("a short run: 30 optimizer steps in all (10 an epoch at batch size 32")
    assert "--epochs 10 gives about 100 steps" in warning
    advised = settings(epochs=10)
    assert plan_of(advised, 300).total_steps >= MIN_STEPS
    assert short_run(plan_of(advised, 300).total_steps, 10, advised) is None
    assert short_run(30, 10, settings(max_steps=30)) is None  # a length the user chose in steps is not second-guessed


def test_unseen_dev_labels_and_ner_types_are_named_with_their_counts(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\na,billing\nb,bug\n", encoding="utf-8")
    (tmp_path / "dev.csv").write_text("text,label\nc,bug\nd,refund\ne,refund\nf,login\n", encoding="utf-8")
    train, dev = readers.read_table(tmp_path / "train.csv"), readers.read_table(tmp_path / "dev.csv")
    warning = unseen_dev_labels(dev, train)
    assert warning.startswith("dev labels never seen in training: 'refund' (2 in dev), 'login' (1 in dev);")
    assert unseen_dev_labels(train, train) is None

    (tmp_path / "train.conll").write_text("Ann B-PER\nsaw O\n\nParis B-LOC\n", encoding="utf-8")
    (tmp_path / "dev.conll").write_text("Acme B-ORG\nCorp I-ORG\nhired O\nBob B-PER\n", encoding="utf-8")
    ner_dev = readers.read_conll(tmp_path / "dev.conll")
    assert "'B-ORG' (1 in dev), 'I-ORG' (1 in dev)" in unseen_dev_labels(ner_dev, readers.read_conll(
        tmp_path / "train.conll"))
