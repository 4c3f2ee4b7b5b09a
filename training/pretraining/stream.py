"""Training reads prepared shards (training.pretraining.shards) as they lie on disk, in an order that is a
function of (seed, epoch) and needs memory for one shuffle window only.

`ShardedInstances` is the instances of one split over every shard, memory-mapped: instance i is found by its
shard (a search over the shards' start indices) and read alone; at most `open_shards` shards are mapped at once,
so what a process holds does not grow with the corpus. `EpochOrder` is an epoch's order: the shards shuffled,
taken `window` shards at a time, and the instances of each window shuffled together (mosaicml-streaming's shuffle
blocks). Position p of the epoch maps to an instance through a few integers, so a resumed run rebuilds its place
without replaying what it skipped, and each rank of a torchrun launch takes positions rank, rank + world, ...
(as DistributedSampler), with every rank reading only its own instances.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from training.pretraining.shards import FIELDS, derive_seed, read_manifest, verify


class ShardedInstances:
    """One split ("train" or "heldout") of a prepared folder, read through memory maps."""

    def __init__(self, folder: str | Path, split: str = "train", open_shards: int = 8, check: bool = True):
        self.folder = Path(folder)
        manifest = read_manifest(self.folder)
        if manifest is None:
            raise FileNotFoundError(f"{self.folder}: not a prepared pretraining folder (no manifest.json)")
        if check:
            verify(self.folder, manifest)
        self.manifest, self.split, self.open_shards = manifest, split, open_shards
        self.counts = np.array([s[split]["instances"] for s in manifest["shards"]], dtype=np.int64)
        self.starts = np.r_[0, np.cumsum(self.counts)].astype(np.int64)
        self.longest = max((s[split]["longest"] for s in manifest["shards"]), default=0)
        self.digest: str = manifest["digest"]
        self._open: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers map their own shards
        return {**self.__dict__, "_open": OrderedDict()}

    def _arrays(self, shard: int) -> dict[str, np.ndarray]:
        arrays = self._open.pop(shard, None)
        if arrays is None:
            base = self.folder / f"shard-{shard:06d}"
            arrays = {f: np.load(base / f"{self.split}.{f}.npy", mmap_mode="r") for f in FIELDS}
            while len(self._open) >= self.open_shards:
                self._open.popitem(last=False)  # unmapped once nothing else holds it
        self._open[shard] = arrays
        return arrays

    def _locate(self, index: int) -> tuple[dict[str, np.ndarray], int]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        shard = int(np.searchsorted(self.starts, index, side="right")) - 1
        return self._arrays(shard), index - int(self.starts[shard])

    def sequence(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, token_type_ids) of one instance, int64."""
        arrays, i = self._locate(index)
        start, end = int(arrays["offsets"][i]), int(arrays["offsets"][i + 1])
        ids = np.asarray(arrays["input_ids"][start:end], dtype=np.int64)
        types = np.zeros_like(ids)
        types[int(arrays["segment_a_lengths"][i]):] = 1
        return ids, types

    def nsp_label(self, index: int) -> int:
        arrays, i = self._locate(index)
        return int(arrays["next_sentence_labels"][i])

    def unigram_counts(self) -> np.ndarray:
        """Training-token counts over every shard (the unigram baseline of the held-out evaluation)."""
        total = np.zeros(self.manifest["vocab_size"], dtype=np.int64)
        for shard in self.manifest["shards"]:
            total += np.load(self.folder / f"shard-{shard['index']:06d}" / "unigram.npy")
        return total

    def epoch_order(self, seed: int, epoch: int, window: int) -> EpochOrder:
        return EpochOrder(self.counts, self.starts, seed, epoch, window)


class EpochOrder:
    """Position p of an epoch -> an instance index, for the shards shuffled and their instances shuffled within
    windows of `window` shards. Holds one window's permutation at a time."""

    def __init__(self, counts: np.ndarray, starts: np.ndarray, seed: int, epoch: int, window: int):
        self.seed, self.epoch = seed, epoch
        order = np.random.default_rng(derive_seed(seed, epoch)).permutation(len(counts))
        self.windows = [order[i:i + window] for i in range(0, len(order), window)]
        sizes = [int(counts[w].sum()) for w in self.windows]
        self.window_starts = np.r_[0, np.cumsum(sizes)].astype(np.int64)
        self.counts, self.starts = counts, starts
        self._cached: tuple[int, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return int(self.window_starts[-1])

    def __getitem__(self, position: int) -> int:
        w = int(np.searchsorted(self.window_starts, position, side="right")) - 1
        if self._cached is None or self._cached[0] != w:
            shards = self.windows[w]
            permutation = np.random.default_rng(derive_seed(self.seed, self.epoch, w)).permutation(
                int(self.counts[shards].sum()))
            self._cached = (w, permutation, np.r_[0, np.cumsum(self.counts[shards])])
        _, permutation, inner = self._cached
        r = int(permutation[position - int(self.window_starts[w])])
        k = int(np.searchsorted(inner, r, side="right")) - 1
        return int(self.starts[self.windows[w][k]]) + r - int(inner[k])


class EpochBatches:
    """One rank's micro-batches of an epoch, made on demand: micro-batch i of rank r holds positions
    (i * batch_size + j) * world_size + r; the last positions wrap to the start so every rank has as many."""

    def __init__(self, order: EpochOrder, rank: int, world_size: int, batch_size: int, first: int = 0):
        self.order, self.rank, self.world_size, self.batch_size, self.first = order, rank, world_size, batch_size, first
        self.per_rank = math.ceil(len(order) / world_size)
        self.total = math.ceil(self.per_rank / batch_size)

    def __len__(self) -> int:
        return self.total - self.first

    def __getitem__(self, item: int | slice) -> list[int] | EpochBatches:
        if isinstance(item, slice):
            if item.step not in (None, 1) or item.stop is not None:
                raise ValueError("only a tail [start:] of the batches can be taken")
            return EpochBatches(self.order, self.rank, self.world_size, self.batch_size, self.first + (item.start or 0))
        i = self.first + item
        if not 0 <= i < self.total:
            raise IndexError(item)
        n = len(self.order)
        return [self.order[(j * self.world_size + self.rank) % n]
                for j in range(i * self.batch_size, min((i + 1) * self.batch_size, self.per_rank))]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]
