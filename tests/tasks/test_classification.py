"""Classification encoding (real tokenizer), label sets and logits decoding."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.classification import decode_classification
from tasks.common import InputTooLong, LabelSet, encode_classification, sigmoid, softmax
from tasks.runtime.tokenizer import CLS, SEP


def test_encode_single_and_pair(tokenizer):
    single = encode_classification(tokenizer, "A charming and affecting journey.")
    assert single.input_ids[0] == tokenizer.token_to_id(CLS)
    assert single.input_ids[-1] == tokenizer.token_to_id(SEP)
    assert set(single.token_type_ids) == {0}
    assert not single.truncated
    pair = encode_classification(tokenizer, "Is it raining?", "It is pouring outside.")
    assert pair.input_ids.count(tokenizer.token_to_id(SEP)) == 2
    assert pair.token_type_ids[-1] == 1 and pair.token_type_ids[0] == 0


def test_truncation_is_reported(tokenizer):
    long_text = "word " * 300
    encoded = encode_classification(tokenizer, long_text, max_length=128)
    assert len(encoded) == 128 and encoded.truncated
    pair = encode_classification(tokenizer, long_text, "short question?", max_length=64)
    assert len(pair) == 64 and pair.truncated
    assert pair.token_type_ids.count(1) == len(tokenizer.encode("short question?", add_special_tokens=False).ids) + 1


def test_no_truncation_raises_input_too_long_with_counts(tokenizer):
    with pytest.raises(InputTooLong) as err:
        encode_classification(tokenizer, "word " * 300, max_length=128, truncate=False)
    assert err.value.num_tokens == 302 and err.value.max_length == 128
    assert "302 tokens" in str(err.value)
    assert isinstance(err.value, ValueError)
    fits = encode_classification(tokenizer, "word " * 126, max_length=128, truncate=False)
    assert len(fits) == 128


def test_label_set_order_and_lookups():
    labels = LabelSet.from_data(["positive", "negative", "neutral", "negative", None])
    assert labels.labels == ["negative", "neutral", "positive"]
    assert LabelSet.from_data(["10", "2", "1", "2"]).labels == ["1", "2", "10"]  # numeric order
    assert labels.id("positive") == 2 and labels.name(0) == "negative"
    assert labels.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    assert labels.label2id == {"negative": 0, "neutral": 1, "positive": 2}
    assert LabelSet.from_id2label({"1": "b", "0": "a"}) == LabelSet(["a", "b"])
    assert LabelSet(["0", "1"]).id(1) == 1  # ids found as numbers in data map to their names
    assert "neutral" in labels and len(labels) == 3 and list(labels) == labels.labels
    with pytest.raises(KeyError, match="unknown label 'mixed'"):
        labels.id("mixed")
    with pytest.raises(ValueError, match="duplicate"):
        LabelSet(["a", "a"])
    with pytest.raises(ValueError, match="ids"):
        LabelSet.from_id2label({0: "a", 2: "b"})


def test_decode_single_label_and_top_k():
    logits = np.array([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]], dtype=np.float32)
    labels = ["neg", "neu", "pos"]
    expected = softmax(logits.astype(np.float64))
    out = decode_classification(logits, labels)
    assert [o["label"] for o in out] == ["neg", "pos"]
    assert out[0]["score"] == pytest.approx(expected[0, 0], rel=1e-6)
    assert isinstance(out[0]["score"], float)
    ranked = decode_classification(logits, labels, top_k=2)
    assert [[d["label"] for d in row] for row in ranked] == [["neg", "neu"], ["pos", "neg"]]
    assert ranked[0][1]["score"] == pytest.approx(expected[0, 1], rel=1e-6)
    everything = decode_classification(logits, LabelSet(labels), top_k=10)
    assert [len(row) for row in everything] == [3, 3]
    assert sum(d["score"] for d in everything[0]) == pytest.approx(1.0, rel=1e-6)


def test_decode_multi_label_uses_independent_sigmoids():
    logits = np.array([[3.0, -2.0, 1.0]])
    out = decode_classification(logits, ["a", "b", "c"], problem_type="multi_label_classification")
    assert [d["label"] for d in out[0]] == ["a", "c", "b"]
    assert [d["score"] for d in out[0]] == pytest.approx(1 / (1 + np.exp(-np.array([3.0, 1.0, -2.0]))), rel=1e-6)
    top1 = decode_classification(logits, ["a", "b", "c"], top_k=1, problem_type="multi_label_classification")
    assert top1 == [[{"label": "a", "score": pytest.approx(1 / (1 + np.exp(-3.0)), rel=1e-6)}]]


def test_decode_regression():
    out = decode_classification(np.array([[3.25], [-0.5]]), [])
    assert out == [{"score": 3.25}, {"score": -0.5}]
    assert decode_classification(np.array([[1.5]]), ["score"], problem_type="regression") == [{"score": 1.5}]


def test_decode_errors():
    with pytest.raises(ValueError, match="labels"):
        decode_classification(np.zeros((1, 3)), ["a", "b"])
    with pytest.raises(ValueError, match="top_k"):
        decode_classification(np.zeros((1, 2)), ["a", "b"], top_k=0)
    with pytest.raises(ValueError, match="problem_type"):
        decode_classification(np.zeros((1, 2)), ["a", "b"], problem_type="ranking")
    with pytest.raises(ValueError, match="shape"):
        decode_classification(np.zeros((1, 2, 3)), ["a", "b", "c"])


def test_softmax_and_sigmoid_are_stable_for_large_logits():
    assert np.allclose(softmax(np.array([[1000.0, 0.0]])), [[1.0, 0.0]])
    assert np.allclose(sigmoid(np.array([-1000.0, 0.0, 1000.0])), [0.0, 0.5, 1.0])
