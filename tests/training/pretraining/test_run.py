"""`berth pretrain` end to end on a slice of the real corpus: a tiny model, a few steps, a small vocabulary.

What is checked: the output folder is a Hugging Face checkpoint that transformers loads without
missing or unexpected keys (and computes the same logits from), fine-tuning takes it as a base,
--eval-only reproduces the held-out metrics exactly (fixed masks), and --no-nsp saves a masked-LM
checkpoint. Whether pretraining *learns* is shown by the real run in docs/PRETRAINING.md, not here.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from berth.cli import main
from tasks.runtime.tokenizer import load_tokenizer
from training.bert.checkpoint import load_pretrained
from training.bert.model import BertForMaskedLM, BertForPreTraining, BertForSequenceClassification
from training.pretraining.data import collate
from training.pretraining.evaluation import evaluate_pretraining, heldout_dataset, load_run_settings
from training.pretraining.masking import MaskingVocab
from training.pretraining.settings import PretrainSettings
from training.pretraining.stream import ShardedInstances

SAMPLES = Path(__file__).resolve().parents[3] / "data" / "samples"
STEPS = 8
# Small and quick: the tiny preset (L2/H128), a 1,000-token vocabulary, 64-token instances.
TINY = ["--preset", "tiny", "--max-seq-length", "64", "--batch-size", "16", "--max-steps", str(STEPS),
        "--heldout-fraction", "0.1", "--log-every", "2", "--eval-every", "4", "--threads", "1", "--lr", "1e-3"]


def _berth(*args: str) -> str:
    """Run the `berth` command in this process and return what it printed (the JSON result on stdout, the
    summary line on stderr)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        assert main(list(args)) == 0
    return printed.getvalue()


@pytest.fixture(scope="module")
def corpus(shared_data) -> list[str]:
    """The first 20 inaugural addresses (1789-1865), one document each: 2 are held out."""
    files = sorted((shared_data / "pretraining" / "inaugural").glob("*.txt"))[:20]
    return [str(f) for f in files]


@pytest.fixture(scope="module")
def nsp_run(corpus, tmp_path_factory) -> tuple[Path, str]:
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("pretrain") / "nsp"
    printed = _berth("pretrain", *corpus, "--out", str(out), "--vocab-size", "1000", *TINY)
    return out, printed


@pytest.fixture(scope="module")
def no_nsp_run(corpus, nsp_run, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("pretrain") / "no-nsp"
    printed = _berth("pretrain", *corpus, "--out", str(out), "--tokenizer", str(nsp_run[0]), "--no-nsp", *TINY)
    return out, printed


def _metrics(folder: Path) -> tuple[list[dict], list[dict]]:
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r.get("split") != "eval"], [r for r in lines if r.get("split") == "eval"]


def test_pretrain_writes_a_checkpoint_with_its_run_record_and_reports_heldout_accuracy(nsp_run, corpus):
    out, printed = nsp_run
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "tokenizer_config.json",
                 "pretrain_run.json", "pretrain_eval.json", "metrics.jsonl"):
        assert (out / name).is_file(), name
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    assert load_tokenizer(out).get_vocab_size() == 1000  # trained on the corpus

    run = json.loads((out / "pretrain_run.json").read_text())
    assert run["seed"] == 12345 and run["git_revision"]
    assert run["settings"]["corpus"] == corpus and run["settings"]["preset"] == "tiny"
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    assert [f["path"] for f in manifest["corpus"]] == [str(Path(c).resolve()) for c in corpus]
    assert run["data"]["folder"] == str(out / "data") and run["data"]["digest"] == manifest["digest"]
    assert run["base"] is None and run["nsp"] is True
    assert run["train_result"]["steps"] == STEPS
    assert run["model_config"]["num_hidden_layers"] == 2 and run["model_config"]["hidden_size"] == 128
    assert 0 < run["heldout_instances"] < run["train_instances"]  # 2 of the 20 documents held out

    train, evaluations = _metrics(out)
    assert [r["step"] for r in train] == [2, 4, 6, 8]
    assert {"loss", "learning_rate", "tokens_per_s", "mlm_accuracy", "nsp_accuracy"} <= set(train[-1])
    assert [r["step"] for r in evaluations] == [4, 8]
    assert evaluations[-1]["mlm_accuracy"] == pytest.approx(run["heldout_eval"]["mlm_accuracy"])

    assert "held-out MLM accuracy" in printed and "NSP accuracy" in printed
    final = run["heldout_eval"]
    assert final["nsp_pairs"] == run["heldout_instances"] and 0 <= final["nsp_accuracy"] <= 1
    assert final["mlm_perplexity"] == pytest.approx(np.exp(final["mlm_loss"]))
    # The unigram baseline: always predict the corpus's most frequent token.
    assert final["unigram_token"] in ("the", ",", ".") and 0.02 < final["unigram_accuracy"] < 0.2


def test_transformers_loads_it_with_no_missing_or_unexpected_keys_and_the_same_logits(nsp_run):
    transformers = pytest.importorskip("transformers")
    out, _ = nsp_run
    reference, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ours, report = load_pretrained(BertForPreTraining, out)
    assert str(report) == "all weights matched"
    encoded = load_tokenizer(out).encode("We the people of the United States", "in order to form a more perfect union")
    inputs = {"input_ids": torch.tensor([encoded.ids]), "token_type_ids": torch.tensor([encoded.type_ids]),
              "attention_mask": torch.ones(1, len(encoded.ids), dtype=torch.long)}
    reference.eval()
    with torch.no_grad():
        expected = reference(**inputs)
        got = ours(**inputs)
    torch.testing.assert_close(got["prediction_logits"], expected.prediction_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got["seq_relationship_logits"], expected.seq_relationship_logits, atol=1e-4, rtol=1e-4)


def test_finetuning_accepts_the_folder_as_its_base(nsp_run, tmp_path):
    from training.finetuning.finetune import FinetuneSettings, run_finetune

    out, _ = nsp_run
    model, report = load_pretrained(BertForSequenceClassification, out, num_labels=3)
    assert report.fresh == ["classifier.weight", "classifier.bias"]  # the encoder and pooler come from pretraining
    assert any(name.startswith("cls.") for name in report.unused)

    settings = FinetuneSettings(task="classification", base=str(out), train_file=SAMPLES / "topics/train.jsonl",
                                dev_file=SAMPLES / "topics/dev.jsonl", out=tmp_path / "finetuned",
                                max_train_examples=32, max_eval_examples=16, max_seq_length=32, epochs=1,
                                batch_size=16, threads=1)
    metrics = run_finetune(settings)
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert (tmp_path / "finetuned" / "vocab.txt").read_text() == (out / "vocab.txt").read_text()


def test_eval_only_reproduces_the_heldout_metrics_with_its_fixed_masks(nsp_run):
    out, _ = nsp_run
    final = json.loads((out / "pretrain_run.json").read_text())["heldout_eval"]
    printed = _berth("pretrain", "--eval-only", "--out", str(out), "--threads", "1")
    assert "held-out MLM accuracy" in printed and "NSP accuracy" in printed
    again = json.loads((out / "pretrain_eval.json").read_text())
    for key in ("mlm_accuracy", "mlm_loss", "nsp_accuracy", "unigram_accuracy", "masked_tokens"):
        assert again[key] == pytest.approx(final[key], abs=1e-6), key

    _berth("pretrain", "--eval-only", "--out", str(out), "--eval-mask-seed", "7", "--threads", "1")
    other_masks = json.loads((out / "pretrain_eval.json").read_text())
    assert other_masks["instances"] == final["instances"] and other_masks["nsp_pairs"] == final["nsp_pairs"]
    assert other_masks["unigram_accuracy"] != final["unigram_accuracy"]  # other positions were masked


def test_eval_text_scores_every_document_of_other_files(nsp_run, shared_data):
    out, _ = nsp_run
    later = sorted((shared_data / "pretraining" / "inaugural").glob("*.txt"))[-4:-1]  # 1993-2001, never seen
    printed = _berth("pretrain", "--eval-only", "--out", str(out), "--eval-text", ",".join(map(str, later)),
                     "--threads", "1")
    assert "NSP accuracy" in printed
    metrics = json.loads((out / "pretrain_eval.json").read_text())
    assert metrics["data"].startswith("all documents of") and metrics["masked_tokens"] > 0


def test_evaluation_counts_every_masked_token_not_batch_means(nsp_run):
    out, _ = nsp_run
    settings = load_run_settings(out)
    tokenizer = load_tokenizer(out)
    dataset = heldout_dataset(ShardedInstances(out / "data", "heldout"), MaskingVocab.from_tokenizer(tokenizer),
                              settings)
    model, _ = load_pretrained(BertForPreTraining, out)
    metrics = evaluate_pretraining(model, dataset, batch_size=7)  # uneven batches

    correct = total = nsp_correct = 0
    with torch.no_grad():
        for start in range(0, len(dataset), 32):
            batch = collate([dataset[i] for i in range(start, min(len(dataset), start + 32))])
            labels, nsp_labels = batch.pop("labels"), batch.pop("next_sentence_label")
            logits = model(**batch)
            chosen = labels != -100
            correct += int((logits["prediction_logits"].argmax(-1)[chosen] == labels[chosen]).sum())
            total += int(chosen.sum())
            nsp_correct += int((logits["seq_relationship_logits"].argmax(-1) == nsp_labels).sum())
    assert metrics["masked_tokens"] == total
    assert metrics["mlm_accuracy"] == pytest.approx(correct / total, abs=1e-6)
    assert metrics["nsp_accuracy"] == pytest.approx(nsp_correct / len(dataset), abs=1e-6)
    assert "unigram_accuracy" not in metrics  # no training counts given


def test_no_nsp_saves_a_masked_lm_checkpoint_and_reports_no_nsp(no_nsp_run):
    transformers = pytest.importorskip("transformers")
    out, printed = no_nsp_run
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    _, info = transformers.BertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert "held-out MLM accuracy" in printed and "NSP accuracy" not in printed

    run = json.loads((out / "pretrain_run.json").read_text())
    assert run["model_class"] == "BertForMaskedLM" and run["settings"]["nsp"] is False and run["nsp"] is False
    assert "nsp_accuracy" not in run["heldout_eval"] and run["heldout_eval"]["masked_tokens"] > 0
    train, _ = _metrics(out)
    assert "mlm_accuracy" in train[-1] and "nsp_loss" not in train[-1]

    # Still a base for fine-tuning: only the pooler (never trained without NSP) and the classifier are new.
    _, report = load_pretrained(BertForSequenceClassification, out)
    assert sorted(report.fresh) == ["bert.pooler.dense.bias", "bert.pooler.dense.weight",
                                    "classifier.bias", "classifier.weight"]
    _, report = load_pretrained(BertForMaskedLM, out)
    assert str(report) == "all weights matched"


def test_an_ablation_is_scored_on_the_very_same_masked_tokens_as_the_run_it_ablates(nsp_run, no_nsp_run):
    nsp_out, _ = nsp_run
    out, _ = no_nsp_run
    own = json.loads((out / "pretrain_eval.json").read_text()) if (out / "pretrain_eval.json").exists() else None
    printed = _berth("pretrain", "--eval-only", "--out", str(out), "--eval-instances-from", str(nsp_out),
                     "--threads", "1")
    assert "held-out MLM accuracy" in printed and "NSP accuracy" not in printed  # a masked LM has no NSP head
    crossed = json.loads((out / f"pretrain_eval-on-{nsp_out.name}.json").read_text())
    reference = json.loads((nsp_out / "pretrain_run.json").read_text())["heldout_eval"]
    # the NSP run's instances and masks: the same count of masked tokens, the same unigram baseline on them
    for key in ("instances", "masked_tokens", "unigram_accuracy", "unigram_perplexity"):
        assert crossed[key] == pytest.approx(reference[key], abs=1e-9), key
    assert crossed["data"].endswith(f"of the run in {nsp_out}")
    if own is not None:  # the model's own evaluation file is left alone
        assert json.loads((out / "pretrain_eval.json").read_text()) == own


def test_settings_take_a_preset_or_explicit_sizes(tmp_path):
    mini = PretrainSettings(out=tmp_path).bert_config(30522)
    assert (mini.num_hidden_layers, mini.hidden_size, mini.num_attention_heads,
            mini.intermediate_size) == (4, 256, 4, 1024)
    custom = PretrainSettings(out=tmp_path, preset="small", num_layers=3, hidden_size=192, num_heads=3).bert_config(999)
    assert (custom.num_hidden_layers, custom.hidden_size, custom.num_attention_heads) == (3, 192, 3)
    assert custom.intermediate_size == 768 and custom.vocab_size == 999
    assert PretrainSettings(out=tmp_path).epochs == 1.0  # neither epochs nor max_steps: one epoch
    with pytest.raises(ValueError, match="unknown preset"):
        PretrainSettings(out=tmp_path, preset="huge")
    assert PretrainSettings(out=tmp_path).effective_learning_rate() == 5e-4  # a new model
    assert PretrainSettings(out=tmp_path, base="default").effective_learning_rate() == 5e-5  # continued
    assert PretrainSettings(out=tmp_path, base="default", learning_rate=1e-4).effective_learning_rate() == 1e-4


def test_max_predictions_scale_with_the_sequence_length(tmp_path, caplog):
    # google-research/bert: max_predictions_per_seq 20 for 128-token sequences, 80 for 512.
    settings = PretrainSettings(out=tmp_path)
    assert [settings.predictions_per_seq(n) for n in (128, 256, 512, 64)] == [20, 40, 80, 10]
    assert PretrainSettings(out=tmp_path, max_seq_length=512).masking().max_predictions_per_seq == 80
    explicit = PretrainSettings(out=tmp_path, max_seq_length=512, max_predictions_per_seq=20)
    with caplog.at_level("WARNING"):
        assert explicit.masking().max_predictions_per_seq == 20  # kept, but 20 of 512 is 4%, not 15%
    assert "max_predictions_per_seq=20" in caplog.text


def test_two_phase_schedule_trains_the_longer_positions(corpus, tmp_path):
    with pytest.raises(ValueError, match="needs max_steps"):
        PretrainSettings(out=tmp_path, phase2_seq_length=512, epochs=1)
    out = tmp_path / "two-phase"
    args = [*TINY, "--max-seq-length", "32", "--phase2-seq-length", "64", "--phase2-fraction", "0.25",
            "--eval-every", "100"]
    _berth("pretrain", *corpus, "--out", str(out), "--vocab-size", "1000", *args)
    record = json.loads((out / "pretrain_run.json").read_text())
    assert record["train_result"]["steps"] == 6 and record["phase2"]["steps"] == 2  # 8 steps: 75% + 25%
    assert record["phase2"]["seq_length"] == 64 and record["phase2"]["max_predictions_per_seq"] == 10
    phase2 = record["phase2"]["train_result"]
    # Phase-2 batches are real 64-token instances: far more than 32 real tokens per example.
    assert phase2["real_tokens"] / (phase2["steps"] * 16) > 40
    assert record["train_result"]["real_tokens"] / (6 * 16) <= 32


def test_a_capped_evaluation_scores_instances_spread_over_the_whole_split():
    from training.pretraining.evaluation import scored_indices

    assert list(scored_indices(5, None)) == [0, 1, 2, 3, 4] and list(scored_indices(5, 9)) == [0, 1, 2, 3, 4]
    picked = scored_indices(1_000_000, 1_000)
    assert len(picked) == 1_000 and picked[0] == 0 and picked[-1] == 999_999  # the first shard and the last
    assert np.all(np.diff(picked) >= 1000)
