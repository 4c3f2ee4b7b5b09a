"""The data order of a training run: a function of (seed, epoch), so that resume can rebuild it exactly.

Every epoch's order is a permutation drawn from a generator seeded by (seed, epoch) (with
group_by_length: grouped so that micro-batches hold similar lengths, still a function of (seed,
epoch) and the lengths), dealt to ranks like DistributedSampler, and cut into micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from training.loop.distributed import shard
from training.loop.settings import TrainSettings


def epoch_permutation(examples: int, seed: int, epoch: int) -> list[int]:
    """The order of one epoch, a function of (seed, epoch) only."""
    generator = torch.Generator().manual_seed(derive_seed(seed, epoch))
    return torch.randperm(examples, generator=generator).tolist()


def length_grouped_permutation(lengths: Sequence[int], seed: int, epoch: int, group: int,
                               chunk_groups: int) -> list[int]:
    """An epoch order whose consecutive runs of `group` indices have similar lengths (transformers'
    group_by_length).

    Shuffle, sort by length (longest first) inside chunks of `chunk_groups` groups, cut into groups,
    shuffle the groups. A partial group (the tail of the last chunk) stays last so every other group
    stays aligned to `group` boundaries. A function of (seed, epoch) and the lengths only, so resume
    rebuilds it exactly. `group` is the micro-batch size times the world size: `shard` deals each
    group round-robin, so every rank's micro-batch comes from one group.
    """
    generator = torch.Generator().manual_seed(derive_seed(seed, epoch, 2))
    order = torch.randperm(len(lengths), generator=generator).tolist()
    chunk = group * chunk_groups
    ordered: list[int] = []
    for start in range(0, len(order), chunk):
        # sorted() is stable: ties keep the shuffle
        ordered += sorted(order[start : start + chunk], key=lambda i: -lengths[i])
    groups = [ordered[i : i + group] for i in range(0, len(ordered), group)]
    tail = [groups.pop()] if len(groups[-1]) < group else []
    shuffled = [groups[i] for i in torch.randperm(len(groups), generator=generator).tolist()]
    return [i for g in shuffled + tail for i in g]


def epoch_batches(examples: int, settings: TrainSettings, epoch: int, rank: int = 0, world_size: int = 1,
                  lengths: Sequence[int] | None = None) -> list[list[int]]:
    """This rank's micro-batches (lists of dataset indices) of `epoch`, in order.

    With `settings.group_by_length`, `lengths` (one per example) is required.
    """
    if settings.group_by_length:
        if lengths is None or len(lengths) != examples:
            raise ValueError("group_by_length needs one length per example")
        order = length_grouped_permutation(lengths, settings.seed, epoch, settings.batch_size * world_size,
                                           settings.length_group_batches)
    else:
        order = epoch_permutation(examples, settings.seed, epoch)
    mine = shard(order, rank, world_size)
    return [mine[i : i + settings.batch_size] for i in range(0, len(mine), settings.batch_size)]


def dataset_lengths(dataset: Any) -> list[int]:
    """One length per item: the dataset's own `lengths` (a method or an array) when it has one, else
    len(item)."""
    own = getattr(dataset, "lengths", None)
    if own is not None:
        return [int(n) for n in (own() if callable(own) else own)]
    return [len(dataset[i]) for i in range(len(dataset))]


def derive_seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0] >> 1)
