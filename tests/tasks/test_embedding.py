"""Embedding task layer: sentence-transformers settings, normalization, cosine, layer choice, token vectors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tasks import embedding
from tasks.runtime.tokenizer import encode


def test_settings_of_the_embedded_sentence_transformers_model(base_path):
    # all-MiniLM-L6-v2: mean pooling, a Normalize module, max_seq_length 256 (its model card says so)
    assert embedding.sentence_transformers_settings(base_path) == {"pooling": "mean", "normalize": True,
                                                                   "max_seq_length": 256}


def test_settings_of_a_plain_bert_folder_and_a_cls_pooling_one(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 128}), encoding="utf-8")
    assert embedding.sentence_transformers_settings(tmp_path) == {"pooling": "mean", "normalize": False,
                                                                  "max_seq_length": 128}
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}), encoding="utf-8")
    assert embedding.sentence_transformers_settings(tmp_path)["pooling"] == "cls"
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}), encoding="utf-8")
    with pytest.raises(ValueError, match="not supported"):
        embedding.sentence_transformers_settings(tmp_path)


def test_normalize_and_cosine():
    vectors = np.array([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(embedding.l2_normalize(vectors), [[0.6, 0.8], [0.0, 0.0]])
    np.testing.assert_allclose(embedding.cosine(np.array([1.0, 0.0]), np.array([[2.0, 0.0], [0.0, 5.0], [-1, 1]])),
                               [1.0, 0.0, -np.sqrt(0.5)], atol=1e-12)


def test_layers_are_checked_against_the_model_depth():
    assert embedding.check_layers([-1, -2, -3, -4], num_layers=6) == [-1, -2, -3, -4]
    assert embedding.check_layers([0, 6], num_layers=6) == [0, 6]
    with pytest.raises(ValueError, match="layer 7 does not exist"):
        embedding.check_layers([7], num_layers=6)
    with pytest.raises(ValueError, match="twice"):
        embedding.check_layers([-1, 6], num_layers=6)


def test_token_vectors_skip_special_tokens_and_concatenate_in_order(tokenizer):
    text = "Hello Berlin"
    encoded = encode(tokenizer, text)
    T, L1, H = len(encoded) + 2, 7, 3  # two padded positions at the end
    hidden = np.arange(T * L1 * H, dtype=np.float32).reshape(T, L1, H)
    tokens = [tokenizer.id_to_token(i) for i in encoded.input_ids]
    got = embedding.token_vectors(encoded, tokens, hidden, [-1, 0])
    assert [(t["token"], text[t["start"] : t["end"]]) for t in got] == [("hello", "Hello"), ("berlin", "Berlin")]
    np.testing.assert_array_equal(got[0]["embedding"], np.concatenate([hidden[1, 6], hidden[1, 0]]))
