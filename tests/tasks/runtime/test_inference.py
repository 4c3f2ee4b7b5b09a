"""The one inference path: batches by padded width within the limits, each item its own rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tasks.runtime.inference import BatchShape, BatchTable, offline_shape, plan_batches, run_items
from tasks.runtime.tokenizer import encode


def echo(feeds):
    """Per token: the ids (so a row shows whose it is); per sequence: the real-token count."""
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    return {"ids": (ids * mask).astype(np.float32), "count": mask.sum(axis=1).astype(np.float32)}


def test_plan_pads_to_the_longest_rounded_and_keeps_the_limits():
    lengths = [5, 30, 9, 17, 8, 16, 31, 3, 100]
    shape = BatchShape([128], max_batch_size=2, max_batch_tokens=64, pad_multiple=8)
    batches = plan_batches(lengths, shape)
    assert sorted(i for b in batches for i in b.members) == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[i] for i in batch.members)
        assert batch.width == -(-longest // 8) * 8  # the longest rounded up to 8, nothing more
        assert len(batch.members) <= 2 and len(batch.members) * batch.width <= max(64, batch.width)
        assert [lengths[i] for i in batch.members] == sorted(lengths[i] for i in batch.members)
    # GPU: widths are the buckets
    gpu = plan_batches(lengths, BatchShape([16, 32, 128], max_batch_size=8, max_batch_tokens=4096))
    assert sorted({b.width for b in gpu}) == [16, 32, 128]
    with pytest.raises(ValueError):
        plan_batches([129], BatchShape([128]))


def test_a_measured_table_sets_the_batch_size_per_width(tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"best_batch_size": {"64": 4, "16": 32, "128": 2}}))
    table = BatchTable.load(path)
    shape = BatchShape([128], max_batch_size=16, max_batch_tokens=100_000, pad_multiple=8, table=table)
    assert shape.batch_size_for(8) == 16  # the table's 32, capped by max_batch_size
    assert shape.batch_size_for(40) == 4  # between 16 and 64: the longer length's entry
    assert shape.batch_size_for(128) == 2
    batches = plan_batches([120] * 5 + [10] * 20, shape)
    assert sorted(len(b.members) for b in batches) == [1, 2, 2, 4, 16]


def test_a_pass_token_budget_sets_the_batch_size_per_width_on_the_cpu():
    shape = BatchShape([512], max_batch_size=32, max_batch_tokens=8192, pad_multiple=8, pass_tokens=1024)
    assert shape.batch_size_for(24) == 32  # 1024 // 24 = 42, capped by max_batch_size
    assert shape.batch_size_for(120) == 8
    assert shape.batch_size_for(384) == 2
    assert shape.batch_size_for(512) == 2 and not shape.fits(3, 500)
    assert shape.batch_size_for(1000) == 1  # one item always runs, however long
    batches = plan_batches([120] * 20 + [24] * 40, shape)
    assert sorted(len(b.members) for b in batches) == [4, 8, 8, 8, 32]
    # a measured table takes precedence over the budget
    table = BatchTable((16,), (4,))
    assert BatchShape([512], pad_multiple=8, pass_tokens=1024, table=table).batch_size_for(16) == 4


def test_an_output_byte_budget_caps_the_tokens_of_a_pass_on_every_device_and_with_a_table():
    # fill-mask on a 30,522-word vocabulary: 122,088 bytes of logits a token; 64 MiB -> 549 tokens
    output_tokens = 64 * 2**20 // (30_522 * 4)
    assert output_tokens == 549
    cpu = BatchShape([512], max_batch_size=32, max_batch_tokens=8192, pad_multiple=8, pass_tokens=1024,
                     output_tokens=output_tokens)
    assert cpu.batch_size_for(128) == 4 and cpu.batch_size_for(24) == 22 and cpu.batch_size_for(512) == 1
    gpu = BatchShape([128, 512], max_batch_size=32, max_batch_tokens=8192, output_tokens=output_tokens)
    assert gpu.batch_size_for(128) == 4
    table = BatchTable((128,), (16,))
    assert BatchShape([512], pad_multiple=8, table=table, output_tokens=output_tokens).batch_size_for(128) == 4


def test_each_item_gets_its_own_rows_in_the_order_given(tokenizer):
    texts = ["Short.", "A much longer sentence about ships and harbours at dawn, and more.", "Mid length one here."] * 5
    items = [encode(tokenizer, t) for t in texts]
    rows = run_items(echo, items, {"ids"}, offline_shape(items, batch_size=4))
    for item, row in zip(items, rows):
        assert row["ids"].tolist() == item.input_ids  # trimmed to the item's own tokens
        assert row["count"] == len(item)  # per sequence: not trimmed
