"""Every head moves between berth and transformers in both directions with the same logits."""

from __future__ import annotations

import pytest
import torch

from tasks.runtime.batching import pad_batch
from tasks.runtime.tokenizer import encode
from training.bert import model as berth_models
from training.bert.checkpoint import CheckpointError, load_pretrained, save_pretrained

transformers = pytest.importorskip("transformers")

HEADS = [
    ("BertForSequenceClassification", {"id2label": {0: "negative", 1: "positive"}}, "logits"),
    ("BertForSequenceClassification", {"num_labels": 1, "problem_type": "regression"}, "logits"),
    ("BertForTokenClassification", {"id2label": {0: "O", 1: "B-PER", 2: "I-PER"}}, "logits"),
    ("BertForQuestionAnswering", {}, "start_logits"),
    ("BertForMultipleChoice", {}, "logits"),
    ("BertForPreTraining", {}, "prediction_logits"),
    ("BertForMaskedLM", {}, "logits"),
]


def _inputs(tokenizer, multiple_choice: bool) -> dict[str, torch.Tensor]:
    items = [encode(tokenizer, "A man is playing a guitar."), encode(tokenizer, "Who?", "Nobody knows who did it.")]
    batch = {k: torch.tensor(v) for k, v in pad_batch(items).items()}
    if multiple_choice:  # (B=1, C=2, T)
        batch = {k: v.unsqueeze(0) for k, v in batch.items()}
    return batch


def _reference_outputs(ref, batch, key):
    out = ref(**batch)
    name = {"prediction_logits": "prediction_logits"}.get(key, key)
    return getattr(out, name)


@pytest.mark.parametrize("class_name,overrides,key", HEADS, ids=[h[0] + str(i) for i, h in enumerate(HEADS)])
def test_ours_saved_loads_in_transformers(tmp_path, base_path, tokenizer, class_name, overrides, key):
    torch.manual_seed(0)
    ours, report = load_pretrained(getattr(berth_models, class_name), base_path, **overrides)
    assert not any(n.startswith("bert.") for n in report.fresh), report  # only head weights may be new
    save_pretrained(ours, tmp_path / "ours", tokenizer_from=base_path)

    ref_cls = getattr(transformers, class_name)
    ref, info = ref_cls.from_pretrained(str(tmp_path / "ours"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ref.eval()
    batch = _inputs(tokenizer, class_name == "BertForMultipleChoice")
    with torch.no_grad():
        got, want = ours(**batch)[key], _reference_outputs(ref, batch, key)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    if class_name == "BertForSequenceClassification" and "id2label" in overrides:
        assert ref.config.id2label == {0: "negative", 1: "positive"}


@pytest.mark.parametrize("class_name,overrides,key", HEADS[:1] + HEADS[2:], ids=[h[0] for h in HEADS[:1] + HEADS[2:]])
def test_transformers_saved_loads_in_ours(tmp_path, base_path, tokenizer, class_name, overrides, key):
    torch.manual_seed(1)
    ref_cls = getattr(transformers, class_name)
    kwargs = {"id2label": overrides["id2label"]} if "id2label" in overrides else {}
    ref = ref_cls.from_pretrained(str(base_path), **kwargs).eval()
    ref.save_pretrained(str(tmp_path / "hf"))
    ours, report = load_pretrained(getattr(berth_models, class_name), tmp_path / "hf")
    assert not report.fresh and not report.resized, report
    batch = _inputs(tokenizer, class_name == "BertForMultipleChoice")
    with torch.no_grad():
        got, want = ours(**batch)[key], _reference_outputs(ref, batch, key)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_legacy_pytorch_bin_is_read_with_weights_only(tmp_path, base_path):
    ref = transformers.BertForSequenceClassification.from_pretrained(str(base_path)).eval()
    ref.save_pretrained(str(tmp_path / "hf"))
    # transformers 5 writes only safetensors; write the legacy file as older releases did.
    (tmp_path / "hf" / "model.safetensors").unlink()
    torch.save(ref.state_dict(), tmp_path / "hf" / "pytorch_model.bin")
    ours, report = load_pretrained(berth_models.BertForSequenceClassification, tmp_path / "hf")
    torch.testing.assert_close(ours.classifier.weight, ref.classifier.weight)


def test_missing_encoder_weight_is_an_error(tmp_path, base_path):
    from safetensors.torch import load_file, save_file

    state = load_file(str(base_path / "model.safetensors"))
    del state["encoder.layer.3.output.dense.weight"]
    (tmp_path / "broken").mkdir()
    save_file(state, str(tmp_path / "broken" / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "broken" / "config.json").write_text((base_path / "config.json").read_text())
    with pytest.raises(CheckpointError, match="encoder.layer.3.output.dense.weight"):
        load_pretrained(berth_models.BertForSequenceClassification, tmp_path / "broken")


def test_new_head_and_unused_weights_are_reported(tmp_path, base_path):
    pre, _ = load_pretrained(berth_models.BertForPreTraining, base_path)
    save_pretrained(pre, tmp_path / "pre")
    clf, report = load_pretrained(berth_models.BertForSequenceClassification, tmp_path / "pre", num_labels=3)
    assert report.fresh == ["classifier.weight", "classifier.bias"]
    assert any(n.startswith("cls.") for n in report.unused)
    assert "newly initialized" in str(report)
