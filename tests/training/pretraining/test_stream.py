"""The epoch order over prepared shards: every instance once an epoch, a new order each epoch, the same order for
the same (seed, epoch), ranks that split an epoch between them as DistributedSampler does, and shuffle windows
that keep a window's instances together."""

from __future__ import annotations

import math

import numpy as np
import pytest

from training.pretraining.stream import EpochBatches, EpochOrder

COUNTS = np.array([40, 0, 17, 33, 25, 8, 61])  # an empty shard too
STARTS = np.r_[0, np.cumsum(COUNTS)]
TOTAL = int(COUNTS.sum())


def _order(seed: int = 3, epoch: int = 0, window: int = 2) -> list[int]:
    order = EpochOrder(COUNTS, STARTS, seed, epoch, window)
    return [order[p] for p in range(len(order))]


def test_an_epoch_is_a_permutation_of_every_instance():
    order = _order()
    assert sorted(order) == list(range(TOTAL))
    assert order != sorted(order)


def test_the_order_is_a_function_of_seed_and_epoch():
    assert _order(3, 0) == _order(3, 0)
    assert _order(3, 1) != _order(3, 0) and sorted(_order(3, 1)) == list(range(TOTAL))
    assert _order(4, 0) != _order(3, 0)


@pytest.mark.parametrize("window", [1, 3, 7])
def test_a_window_of_shards_is_read_together(window):
    shard_of = np.searchsorted(STARTS, _order(window=window), side="right") - 1
    seen: list[set[int]] = []
    for shard in shard_of:  # the shards of consecutive windows, in reading order
        if not seen or (shard not in seen[-1] and len(seen[-1] | {shard}) > window):
            seen.append(set())
        seen[-1].add(int(shard))
    assert all(len(group) <= window for group in seen)
    assert len({s for group in seen for s in group}) == int((COUNTS > 0).sum())


@pytest.mark.parametrize("world_size, batch_size", [(1, 16), (2, 16), (3, 8)])
def test_ranks_share_an_epoch_like_distributed_sampler(world_size, batch_size):
    order = _order()
    per_rank = math.ceil(TOTAL / world_size)
    padded = (order * 2)[:per_rank * world_size]  # DistributedSampler(drop_last=False) wraps to the start
    for rank in range(world_size):
        batches = EpochBatches(EpochOrder(COUNTS, STARTS, 3, 0, 2), rank, world_size, batch_size)
        flat = [i for batch in batches for i in batch]
        assert flat == padded[rank::world_size]
        assert len(batches) == math.ceil(per_rank / batch_size)
        assert all(len(b) == batch_size for b in list(batches)[:-1])
        tail = batches[2:]  # what a resumed run reads after 2 micro-batches: the same, without replaying
        assert len(tail) == len(batches) - 2 and list(tail) == list(batches)[2:]
