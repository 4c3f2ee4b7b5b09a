"""The pooling of a sequence head round-trips: save -> load -> ONNX export -> served scores.

The expectations come from outside berth: a mean-pooled head must score what sentence-transformers'
own mean pooling of the same all-MiniLM-L6-v2 checkpoint gives, fed through the head's weights; a
cls-pooled head what transformers' BertForSequenceClassification gives on the saved folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from export.bundle_builder import export_bundle  # noqa: E402
from export.settings import ExportSettings  # noqa: E402
from tasks.runtime.spec import TaskSpec  # noqa: E402
from tests.service.conftest import ServerProcess  # noqa: E402
from training.bert.checkpoint import load_pretrained, save_pretrained  # noqa: E402
from training.bert.model import BertForSequenceClassification  # noqa: E402
from training.finetuning.finetune import default_pooling  # noqa: E402

LABELS = ["negative", "neutral", "positive"]
TEXTS = ["A gripping, beautifully acted film.", "It's slow -- very, very slow.",
         "The committee meets on Tuesday.", "Short."]


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def sentence_transformers_mean(base: Path, texts: list[str]) -> np.ndarray:
    """all-MiniLM-L6-v2's Transformer + Pooling modules (its Normalize module left out)."""
    from sentence_transformers import SentenceTransformer

    full = SentenceTransformer(str(base), device="cpu")
    assert full[1].pooling_mode == "mean"
    unnormalized = SentenceTransformer(modules=[full[0], full[1]], device="cpu")
    return unnormalized.encode(texts, convert_to_numpy=True, batch_size=len(texts))


def transformers_cls_logits(folder: Path, texts: list[str]) -> np.ndarray:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(**tokenizer(texts, padding=True, return_tensors="pt")).logits.numpy()


def make_head(base: Path, folder: Path, pooling: str) -> BertForSequenceClassification:
    torch.manual_seed(3)
    model, _ = load_pretrained(BertForSequenceClassification, base, id2label=dict(enumerate(LABELS)),
                               classifier_pooling=pooling)
    save_pretrained(model, folder, tokenizer_from=base)
    TaskSpec(task="classification", labels=LABELS, problem_type="single_label_classification", max_seq_length=64,
             pooling=pooling).save(folder)
    return model


def test_default_pooling_follows_the_base(base_path, tmp_path):
    assert default_pooling(base_path) == "mean"  # all-MiniLM-L6-v2's 1_Pooling/config.json says mean
    (tmp_path / "config.json").write_text("{}")
    assert default_pooling(tmp_path) == "cls"  # a plain BERT folder: its NSP-trained pooler
    (tmp_path / "config.json").write_text('{"model_type": "berth_mean_pooled_bert", "classifier_pooling": "mean"}')
    assert default_pooling(tmp_path) == "mean"  # a fine-tuned mean-pooled head: no trained pooler to switch to


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_pooling_round_trips_to_the_served_scores(base_path, tmp_path, pooling):
    torch.set_num_threads(2)
    folder = tmp_path / "head"
    model = make_head(base_path, folder, pooling)
    config = json.loads((folder / "config.json").read_text())
    assert config.get("classifier_pooling", "cls") == pooling
    assert ("bert.pooler.dense.weight" in model.state_dict()) == (pooling == "cls")  # mean: no pooler at all

    # The outside reference for what this head computes.
    weight, bias = model.classifier.weight.detach().numpy(), model.classifier.bias.detach().numpy()
    if pooling == "mean":
        expected = sentence_transformers_mean(base_path, TEXTS) @ weight.T + bias
    else:
        expected = transformers_cls_logits(folder, TEXTS)

    reloaded, _ = load_pretrained(BertForSequenceClassification, folder)  # what export loads
    assert reloaded.pooling == pooling

    repository = tmp_path / "repository"
    export_bundle(ExportSettings(model_folder=folder, out=repository / "head", optimize="never", parity_examples=4,
                                 threads=2))
    manifest = json.loads((repository / "head" / "bundle.json").read_text())
    assert manifest["model_config"]["classifier_pooling"] == pooling

    server = ServerProcess(repository, tmp_path / "serve.log").wait_ready()
    try:
        response = httpx.post(f"{server.url}/v1/classify", json={"inputs": TEXTS, "top_k": 3}, timeout=120)
    finally:
        server.stop()
    assert response.status_code == 200, response.text
    probabilities = softmax(expected)
    for got, want in zip(response.json()["results"], probabilities):
        scores = {entry["label"]: entry["score"] for entry in got}  # top_k: the ranked list
        assert [scores[label] for label in LABELS] == pytest.approx(want.tolist(), abs=1e-4)
