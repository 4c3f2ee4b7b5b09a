"""Feature-based NER (the paper's Table 7): frozen last-four-layer features, a BiLSTM head, and the
whole path (train, save, load, evaluate, export, serve) on a slice of CoNLL-2003, from the real checkpoint."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch

from berth.cli import main
from tasks import ner
from tasks.registry import head_class
from tasks.runtime.spec import TaskSpec
from tasks.runtime.tokenizer import load_tokenizer
from training.bert.checkpoint import load_pretrained, read_state_dict
from training.bert.model import BertFeatureBasedTokenClassification, PaddingFreeBiLSTM
from training.bert.torch_runner import predict
from training.finetuning.evaluate import evaluate_model
from training.finetuning.feature_based import cache_features

SENTENCES = ["EU rejects German call to boycott British lamb .", "Peter Blackburn", "BRUSSELS 1996-08-22",
             "The European Commission said on Thursday it disagreed with German advice to consumers ."]
LABELS = ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]


def _conll_slice(shared_data, name: str, sentences: int, path) -> None:
    """The first `sentences` sentences of a CoNLL-2003 file (blank-line separated), written to `path`."""
    blocks = (shared_data / "conll2003" / "iob2" / name).read_text(encoding="utf-8").strip().split("\n\n")
    path.write_text("\n\n".join(blocks[:sentences]) + "\n", encoding="utf-8")


def test_cached_last_four_layer_features_equal_transformers_hidden_states(base_path, tokenizer):
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(2)
    model, _ = load_pretrained(BertFeatureBasedTokenClassification, base_path, id2label=dict(enumerate(LABELS)))
    reference = transformers.BertModel.from_pretrained(str(base_path), output_hidden_states=True).eval()
    words = [ner.encode_words(tokenizer, s.split(), max_length=64) for s in SENTENCES]
    features = [_Feature(w.encoded, list(range(len(w.encoded)))) for w in words]
    # The training cache: length-sorted batches of 3 (padding inside), trimmed back per sentence, input order.
    exact, record = cache_features(model, features, dtype=torch.float32, batch_size=3)
    half, half_record = cache_features(model, features, dtype=torch.float16, batch_size=3)
    assert record["sentences"] == 4 and record["tokens"] == sum(map(len, features)) and record["feature_width"] == 1536
    assert (half_record["dtype"] == "float16"
            and half_record["cache_mb"] == pytest.approx(record["cache_mb"] / 2, abs=0.1))
    for feature, ours, ours_half in zip(features, exact, half):
        ids = torch.tensor([feature.input_ids])
        with torch.no_grad():
            states = reference(input_ids=ids, attention_mask=torch.ones_like(ids)).hidden_states  # L + 1 of (1, T, H)
        want = torch.cat(states[-4:], dim=-1)[0]  # (T, 4H): layers L-3 .. L
        assert ours.features.shape == want.shape == (len(feature), 4 * 384)
        assert list(ours.labels) == feature.targets["labels"]
        torch.testing.assert_close(ours.features, want, atol=2e-5, rtol=0)
        assert ours_half.features.dtype == torch.float16
        torch.testing.assert_close(ours_half.features.float(), want, atol=1e-2, rtol=1e-3)  # float16 rounding


class _Feature:
    """What task_data.NERAdapter.features gives: token ids and per-token labels."""

    def __init__(self, encoded, labels):
        self.input_ids, self.token_type_ids, self.targets = (encoded.input_ids, encoded.token_type_ids,
                                                             {"labels": labels})

    def __len__(self) -> int:
        return len(self.input_ids)


def test_bilstm_equals_torch_packed_bidirectional_lstm_whatever_the_padding():
    torch.manual_seed(0)
    ours = PaddingFreeBiLSTM(input_size=12, hidden_size=8, num_layers=2).eval()
    packed = torch.nn.LSTM(12, 8, num_layers=2, bidirectional=True, batch_first=True).eval()
    with torch.no_grad():  # the same weights: layer k of each direction
        for k in range(2):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(packed, f"{name}_l{k}").copy_(getattr(ours.forward_layers[k], f"{name}_l0"))
                getattr(packed, f"{name}_l{k}_reverse").copy_(getattr(ours.backward_layers[k], f"{name}_l0"))
    lengths = torch.tensor([7, 3, 5, 1])
    x = torch.randn(4, 7, 12)
    mask = (torch.arange(7)[None, :] < lengths[:, None]).long()
    x = x * mask[..., None] + 100.0 * (1 - mask[..., None])  # loud padding: it must not leak in
    with torch.no_grad():
        got = ours(x, mask)
        sequence = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        want, _ = torch.nn.utils.rnn.pad_packed_sequence(packed(sequence)[0], batch_first=True)
    for row, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(got[row, :n], want[row, :n], atol=1e-6, rtol=0)


def test_feature_based_ner_trains_a_frozen_encoder_and_exports_a_served_bundle(tmp_path, shared_data, base_path):
    from export.bundle_builder import export_bundle
    from export.settings import ExportSettings
    from tests.service.conftest import ServerProcess

    train, dev, out = tmp_path / "train.txt", tmp_path / "dev.txt", tmp_path / "model"
    _conll_slice(shared_data, "train.txt", 240, train)
    _conll_slice(shared_data, "valid.txt", 60, dev)
    assert main(["finetune", "--task", "ner", "--feature-based", "--lstm-hidden-size", "64", "--train", str(train),
                 "--dev", str(dev), "--out", str(out), "--epochs", "3", "--lr", "3e-3", "--batch-size", "16",
                 "--max-seq-length", "64", "--threads", "2", "--seed", "7", "--precision", "fp32"]) == 0
    spec = TaskSpec.load(out)
    assert spec.task == "ner" and head_class(spec) == "BertFeatureBasedTokenClassification"
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertFeatureBasedTokenClassification"]
    assert config["feature_layers"] == [-4, -3, -2, -1] and config["lstm_hidden_size"] == 64

    # The encoder is frozen: every one of its weights is bit-identical to the base checkpoint's.
    base, saved = read_state_dict(base_path), read_state_dict(out)
    encoder = [k for k in base if k.startswith(("embeddings.", "encoder.")) and not k.endswith("position_ids")]
    assert len(encoder) > 90
    assert all(torch.equal(saved[f"bert.{k}"], base[k]) for k in encoder)
    # ... while the head learned: more entities found than the untrained head's none, and the loss fell.
    record = json.loads((out / "finetune_run.json").read_text())
    assert (record["feature_cache"]["sentences"] == record["train_examples"] > 200
            and record["feature_cache"]["extract_minutes"] >= 0)
    assert record["train_result"]["final_loss"] < 0.6 * np.log(len(spec.labels))
    assert spec.dev_metrics["f1"] > 0.1  # a head that has not learned answers "O" everywhere: F1 0

    again = evaluate_model(out, dev)
    assert again["f1"] == pytest.approx(spec.dev_metrics["f1"]) and again["n_gold"] == spec.dev_metrics["n_gold"]

    bundle = export_bundle(ExportSettings(model_folder=out, out=tmp_path / "repository" / "feature-ner",
                                          precision="fp32", optimize="never", parity_examples=32, threads=2,
                                          data_dir=shared_data))
    assert bundle.task == "ner" and bundle.parity["passed"] and bundle.parity["max_abs_diff"] <= 1e-4

    text = "Peter Blackburn of the European Commission said in Brussels on Thursday that Germany was wrong ."
    model, _ = load_pretrained(BertFeatureBasedTokenClassification, out)
    tokenizer = load_tokenizer(out)
    windows = ner.ner_windows(tokenizer, text, spec.max_seq_length, spec.doc_stride)
    logits = predict(model, list(windows), ["logits"], per_token=True)["logits"]
    want = ner.decode_entities(text, windows, logits, spec.labels, "simple")  # PyTorch, one text alone
    server = ServerProcess(tmp_path / "repository", tmp_path / "serve.log")
    try:
        server.wait_ready()
        response = httpx.post(f"{server.url}/v1/ner", json={"inputs": [text, "Blackburn", text]}, timeout=120)
    finally:
        server.stop()
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert ([(e["entity"], e["start"], e["end"]) for e in results[0]]
            == [(e["entity"], e["start"], e["end"]) for e in want])
    assert results[2] == results[0]  # batched with a shorter text: the padding changes nothing
