"""Every head berth saves is, to transformers, the same model or one it refuses: never another model that loads.

The reference is transformers itself on the saved folder: its own BERT classes for the heads it has (logits
equal to berth's), its Auto classes and pipeline with the folder's own code for a mean-pooled head, and a refusal
for a mean-pooled head without `trust_remote_code` and for the feature-based tagger it has no class for.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tasks.hf_layout import FEATURE_BASED_TYPE, MEAN_POOLED_TYPE  # noqa: E402
from tasks.model_card import finetuned_card  # noqa: E402
from training.bert import model as models  # noqa: E402
from training.bert.checkpoint import load_pretrained, save_pretrained  # noqa: E402

LABELS = ["billing", "bug", "login"]
TEXTS = ["I was charged twice this month.", "The app crashes when I open settings.", "Cannot sign in", "ok"]


def saved_head(base: Path, folder: Path, head: str, **config) -> torch.nn.Module:
    torch.manual_seed(5)
    model, _ = load_pretrained(getattr(models, head), base, **config)
    save_pretrained(model, folder, tokenizer_from=base)
    return model.eval()


def feeds(folder: Path, texts=TEXTS) -> dict[str, torch.Tensor]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    return dict(tokenizer(texts, padding=True, return_tensors="pt"))


def berth_logits(model, batch) -> np.ndarray:
    with torch.no_grad():
        return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])["logits"].numpy()


@pytest.mark.parametrize("head, hf_class, config", [
    ("BertForSequenceClassification", "BertForSequenceClassification",
     {"id2label": dict(enumerate(LABELS)), "classifier_pooling": "cls"}),
    ("BertForTokenClassification", "BertForTokenClassification", {"id2label": {0: "O", 1: "B-ORG", 2: "I-ORG"}}),
    ("BertForQuestionAnswering", "BertForQuestionAnswering", {}),
    ("BertForMultipleChoice", "BertForMultipleChoice", {}),
])
def test_a_head_transformers_has_is_the_same_model_there(base_path, tmp_path, head, hf_class, config):
    model = saved_head(base_path, tmp_path / "head", head, **config)
    assert json.loads((tmp_path / "head" / "config.json").read_text())["model_type"] == "bert"
    theirs = getattr(transformers, hf_class).from_pretrained(str(tmp_path / "head")).eval()
    batch = feeds(tmp_path / "head")
    if hf_class == "BertForMultipleChoice":  # (B, C, T): the texts as two examples of two choices
        batch = {k: v.view(2, 2, -1) for k, v in batch.items()}
    with torch.no_grad():
        out, ours = theirs(**batch), model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    names = ("start_logits", "end_logits") if hf_class == "BertForQuestionAnswering" else ("logits",)
    expected = np.stack([getattr(out, name).numpy() for name in names])
    got = np.stack([ours[name].numpy() for name in names])
    if hf_class == "BertForTokenClassification":  # padding positions are no answer
        mask = batch["attention_mask"].numpy().astype(bool)
        got, expected = got[:, mask], expected[:, mask]
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_a_mean_pooled_head_is_refused_plain_and_the_same_with_its_code(base_path, tmp_path):
    folder = tmp_path / "my-tickets"
    model = saved_head(base_path, folder, "BertForSequenceClassification", id2label=dict(enumerate(LABELS)),
                       classifier_pooling="mean")
    assert json.loads((folder / "config.json").read_text())["model_type"] == MEAN_POOLED_TYPE
    with pytest.raises(ValueError):  # not BertForSequenceClassification with a random pooler
        transformers.AutoModelForSequenceClassification.from_pretrained(str(folder))
    with pytest.raises(ValueError):
        transformers.pipeline("text-classification", model=str(folder))

    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder), trust_remote_code=True)
    batch = feeds(folder)
    with torch.no_grad():
        expected = theirs.eval()(**batch).logits.numpy()
    np.testing.assert_allclose(berth_logits(model, batch), expected, atol=1e-4)
    classify = transformers.pipeline("text-classification", model=str(folder), trust_remote_code=True, device="cpu")
    probabilities = torch.softmax(torch.from_numpy(berth_logits(model, batch)), -1).numpy()
    answers = classify(TEXTS)
    assert [a["label"] for a in answers] == [LABELS[i] for i in probabilities.argmax(-1)]
    np.testing.assert_allclose([a["score"] for a in answers], probabilities.max(-1), atol=1e-4)
    # berth reads its own folder back
    again, report = load_pretrained(models.BertForSequenceClassification, folder)
    assert not report.fresh and again.pooling == "mean"


def test_a_feature_based_tagger_is_refused(base_path, tmp_path):
    folder = tmp_path / "tagger"
    saved_head(base_path, folder, "BertFeatureBasedTokenClassification", id2label={0: "O", 1: "B-PER", 2: "I-PER"},
               lstm_hidden_size=8)
    assert json.loads((folder / "config.json").read_text())["model_type"] == FEATURE_BASED_TYPE
    with pytest.raises(ValueError):
        transformers.AutoModelForTokenClassification.from_pretrained(str(folder))


def test_the_card_says_how_to_load_it(base_path, tmp_path):
    folder = tmp_path / "my-tickets"
    saved_head(base_path, folder, "BertForSequenceClassification", id2label=dict(enumerate(LABELS)),
               classifier_pooling="mean")
    (folder / "finetune_run.json").write_text(json.dumps({"settings": {"out": "runs/my-tickets",
                                                                       "train_file": "/tmp/x/train.csv"}}))
    (folder / "berth_task.json").write_text(json.dumps({"task": "classification", "labels": LABELS}))
    card = finetuned_card(folder)
    assert "berth export runs/my-tickets --out models/my-tickets" in card
    assert "trust_remote_code=True" in card and "refuses" in card
    assert "datasets:" not in card  # a temporary folder names no data set
