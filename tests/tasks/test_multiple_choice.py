"""Multiple choice task layer: SWAG CSV and JSON-lines readers, encoding, ranking, accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tasks import multiple_choice

SWAG_SAMPLE = Path(__file__).parent / "data" / "swag_sample.csv"


def test_swag_csv_reader_joins_sent2_with_each_ending():
    examples = multiple_choice.read_choices(SWAG_SAMPLE)
    assert len(examples) == 3
    first, second = examples[0], examples[1]
    assert first.id == "101" and first.context == "The chef cracks two eggs into a bowl."
    assert first.choices == ["She whisks them with a fork.", "She drives the bowl to the airport.",
                             "She paints the eggs on the ceiling.", "She sings to the empty oven."]
    assert first.label == 0
    assert second.choices[1] == "He checks the oil level, then closes it."  # a quoted field with a comma
    assert [e.label for e in examples] == [0, 1, 2]


def test_swag_reader_refuses_another_csv(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("text,label\nhello,1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not a SWAG CSV"):
        multiple_choice.read_swag(path)


def test_jsonl_reader_and_label_check(tmp_path):
    path = tmp_path / "choices.jsonl"
    rows = [{"id": "q1", "context": "Where is Paris?", "choices": ["France", "Peru", "Chad"], "label": 0},
            {"context": "2 + 2 =", "choices": ["3", "4"], "label": 1}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    examples = multiple_choice.read_choices(path)
    assert [(e.id, e.label, len(e.choices)) for e in examples] == [("q1", 0, 3), ("2", 1, 2)]
    path.write_text(json.dumps({"context": "x", "choices": ["a", "b"], "label": 2}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="label 2"):
        multiple_choice.read_choices(path)


def test_encode_choices_pairs_the_context_with_each_choice(tokenizer):
    items = multiple_choice.encode_choices(tokenizer, "the cat sat", ["on the mat", "in the hat"], max_length=16)
    tokens = [tokenizer.id_to_token(i) for i in items[1].input_ids]
    assert tokens == ["[CLS]", "the", "cat", "sat", "[SEP]", "in", "the", "hat", "[SEP]"]
    assert items[1].token_type_ids == [0] * 5 + [1] * 4
    long = multiple_choice.encode_choices(tokenizer, "word " * 50, ["short answer"], max_length=16)[0]
    assert len(long) == 16 and long.truncated and [tokenizer.id_to_token(i) for i in long.input_ids][-3:] == [
        "short", "answer", "[SEP]"]


def test_rank_choices_softmax_and_order():
    ranked = multiple_choice.rank_choices(np.array([0.0, np.log(3.0), 0.0]), ["a", "b", "c"])
    assert [r["index"] for r in ranked] == [1, 0, 2]  # ties keep request order
    np.testing.assert_allclose([r["score"] for r in ranked], [0.6, 0.2, 0.2], atol=1e-6)
    assert multiple_choice.accuracy([1, 0, 2], [1, 2, 2]) == pytest.approx(2 / 3)
