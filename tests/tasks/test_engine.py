"""The one in-process engine (tasks/engine.py): its two rules against the models' output shapes, and its answers
against transformers on the same fine-tuned folders, on one session and on lanes side by side."""

from __future__ import annotations

import pytest

from tasks.engine import Engine, pass_shape, token_rows
from tasks.registry import definition

TEXTS = ["A charming and often affecting journey.", "Unflinchingly bleak and desperate.",
         "A gorgeous, witty, seductive movie that never lets up.", "Dull.", "The plot goes nowhere " * 20]


@pytest.mark.parametrize("task, rows", [
    ("ner", True),  # logits (B, T, labels)
    ("qa", True),  # start and end logits (B, T)
    ("fill-mask", True),  # logits (B, T, vocabulary)
    ("embedding", frozenset({"hidden_states"})),  # (B, T, layers + 1, H) beside the pooled (B, H)
    ("classification", frozenset()),  # logits (B, labels)
    ("rerank", frozenset()),
])
def test_token_rows_are_the_outputs_with_a_row_per_token(task, rows):
    assert token_rows(definition(task)) == rows


def test_one_pass_is_capped_by_the_cpu_token_budget_and_the_output_bytes():
    fill_mask_token = 30522 * 4  # a padded token's float32 logits over the uncased vocabulary
    cpu = pass_shape([128], cuda=False, max_batch_size=64, max_batch_tokens=8192, pad_multiple=8, pass_tokens=1024,
                     bytes_per_token=0)
    assert cpu.batch_size_for(64) == 16 and cpu.output_tokens is None  # 1024 padded tokens of width 64
    gpu = pass_shape([128], cuda=True, max_batch_size=64, max_batch_tokens=8192, pad_multiple=8, pass_tokens=1024,
                     bytes_per_token=fill_mask_token)
    assert gpu.pass_tokens is None and gpu.output_tokens == 64 * 2**20 // fill_mask_token == 549
    assert gpu.batch_size_for(64) == 8  # 549 tokens of logits: 8 rows of 64


@pytest.mark.parametrize("lanes", [1, 2])
def test_the_engine_answers_as_transformers_does(bundle_repository, checkpoints, lanes):  # noqa: F811
    from tests.service import reference

    engine = Engine.load(bundle_repository / "sentiment", threads=2, lanes=lanes)
    try:
        assert engine.lanes == lanes
        got = engine(TEXTS, engine.definition.options(truncate=True))
    finally:
        engine.close()
    expected = reference.classify(checkpoints["sentiment"], TEXTS)
    assert [r["label"] for r in got] == [r["label"] for r in expected]
    assert [r["score"] for r in got] == pytest.approx([r["score"] for r in expected], abs=1e-4)
