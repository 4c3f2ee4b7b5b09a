"""The one inference path: model items -> batches by length -> padded forward passes -> each item's rows.

Training's dev metrics (`training/bert/torch_runner.py`, a PyTorch runner), the parity gate and the service's
batcher (an ONNX Runtime runner behind its queue) all run items through these functions, so what is
evaluated is what is served. A *batch* is what one forward pass sees.

    plan_batches(lengths, shape)  sort by length; one batch per padded width (CPU: the longest item
                                  rounded up to `pad_multiple`; GPU: its length bucket), split to the
                                  batch-size limit for that width and to the token budget
    run_batch(runner, items, batch, per_token)   pad -> run -> each item's own rows (a copy, or what its
                                  Keep reduces them to: never a view that holds the whole batch's arrays)
    iter_batches / run_items      both, over all items (results in the caller's order)

Two kinds of runner, both torch-free types:
    Runner       one padded forward pass: int64 feeds -> float arrays by output name (ONNX Runtime:
                 tasks/runtime/onnx_session.onnx_runner, which the service's batcher runs; PyTorch:
                 training/bert/torch_runner.torch_runner)
    ItemRunner   model items -> each item's rows, batched here (`item_runner` makes one of a Runner): what
                 the task definitions evaluate and predict with (onnx_item_runner, torch_item_runner)
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tasks.runtime.batching import pad_batch

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
Rows = dict[str, np.ndarray]  # one item's outputs by name
BATCH_TABLE_FILE = "batch_table.json"
# The default byte budget of one pass's per-token outputs (the service's max_pass_output_bytes, `berth predict`'s)
PASS_OUTPUT_BYTES = 64 * 1024 * 1024


class ModelItem(Protocol):
    """What the task layer makes of an input: EncodedInput, QAWindow (a sequence of token ids)."""

    input_ids: Any
    token_type_ids: Any

    def __len__(self) -> int: ...


# (items, output names, per_token) -> one Rows per item, in the order given.
ItemRunner = Callable[[Sequence[ModelItem], Sequence[str], bool], list[Rows]]


@dataclass(frozen=True, slots=True)
class BatchTable:
    """Measured best batch size by padded length (bench/batch_table.py): for a width between two measured
    lengths the longer one's entry holds (a longer sequence never gets a larger batch than measured)."""

    lengths: tuple[int, ...]  # sorted
    batch_sizes: tuple[int, ...]

    def best_batch_size(self, width: int) -> int:
        i = min(bisect_left(self.lengths, width), len(self.lengths) - 1)
        return self.batch_sizes[i]

    @classmethod
    def load(cls, path: str | Path) -> BatchTable:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        best = sorted((int(length), int(size)) for length, size in data["best_batch_size"].items())
        if not best or min(size for _, size in best) < 1:
            raise ValueError(f"{path}: best_batch_size needs at least one length with a positive batch size")
        return cls(tuple(length for length, _ in best), tuple(size for _, size in best))


@dataclass(slots=True)
class BatchShape:
    """How items become batches: padded widths and the limits of one forward pass."""

    buckets: list[int]  # sorted padded lengths; the last is the longest item accepted
    max_batch_size: int = 32
    max_batch_tokens: int = 8192  # padded tokens (items x width) of one pass
    pad_multiple: int | None = None  # CPU: pad to the longest item rounded up to this; None: to its bucket (GPU)
    table: BatchTable | None = field(default=None)  # measured batch size per width, capped by max_batch_size
    # CPU: padded tokens of one pass past which a larger batch only adds latency (without a measured table)
    pass_tokens: int | None = None
    # padded tokens of one pass whose per-token outputs fit the pass's output byte budget (any device, any table)
    output_tokens: int | None = None

    def width_for(self, length: int) -> int | None:
        """The padded width of a batch whose longest item has `length` tokens; None when too long."""
        if length > self.buckets[-1]:
            return None
        if self.pad_multiple is not None:
            return min(self.buckets[-1], -(-max(length, 1) // self.pad_multiple) * self.pad_multiple)
        return self.buckets[bisect_left(self.buckets, length)]

    def batch_size_for(self, width: int) -> int:
        """Most items in one pass at this width: the measured table's choice (else as many as `pass_tokens`
        allows), within `output_tokens` and max_batch_size, at least one."""
        limit = self.max_batch_size if self.table is None else min(self.max_batch_size,
                                                                   self.table.best_batch_size(width))
        tokens = min(self.max_batch_tokens, self.pass_tokens) if self.pass_tokens and self.table is None \
            else self.max_batch_tokens
        if self.output_tokens:
            tokens = min(tokens, self.output_tokens)
        return max(1, min(limit, tokens // max(width, 1)))

    def fits(self, count: int, longest: int) -> bool:
        """Could `count` items whose longest has `longest` tokens run in one pass?"""
        width = self.width_for(longest)
        return width is not None and count <= self.batch_size_for(width) and count * width <= self.max_batch_tokens


@dataclass(frozen=True, slots=True)
class Batch:
    """One forward pass: which items (indices into the caller's list, shortest first) at which width."""

    members: tuple[int, ...]
    width: int


def plan_batches(lengths: Sequence[int], shape: BatchShape) -> list[Batch]:
    """Items sorted by length (stable), one run of batches per padded width, each batch within the limits."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    by_width: dict[int, list[int]] = {}
    for i in order:
        width = shape.width_for(lengths[i])
        if width is None:
            raise ValueError(f"an item of {lengths[i]} tokens is longer than the longest bucket ({shape.buckets[-1]})")
        by_width.setdefault(width, []).append(i)
    batches = []
    for width, members in by_width.items():
        size = shape.batch_size_for(width)
        batches += [Batch(tuple(members[at : at + size]), width) for at in range(0, len(members), size)]
    return batches


@dataclass(frozen=True, slots=True)
class Keep:
    """What one item keeps of its forward pass: the outputs `names`, and `reduce(item, rows)` applied where the pass
    ran (a worker thread) to shrink them to what decoding needs (fill-mask: the top k at each [MASK]; token vectors:
    the chosen layers). Without `reduce` the rows are copied: an item never holds a view of the whole batch's
    arrays, so what a request keeps until it is answered is its own rows, not its passes' outputs."""

    names: tuple[str, ...]
    reduce: Callable[[Any, Rows], Rows] | None = None

    def __call__(self, item: Any, rows: Rows) -> Rows:
        if self.reduce is not None:
            return self.reduce(item, rows)
        return {name: np.array(rows[name]) for name in self.names}


def output_names_of(keeps: Sequence[Keep | None], every: Sequence[str]) -> list[str]:
    """The outputs one pass must return for these items (all of `every` when an item keeps everything)."""
    if any(keep is None for keep in keeps):
        return list(every)
    wanted = {name for keep in keeps for name in keep.names}  # type: ignore[union-attr]
    return [name for name in every if name in wanted]


def split_rows(outputs: dict[str, np.ndarray], lengths: Sequence[int], per_token: bool | Collection[str]) -> list[Rows]:
    """Each row of a pass's outputs as its item's own (views: `Keep` copies or reduces them); per-token outputs
    trimmed to the item's length, so padding never reaches decoding. `per_token`: all outputs, none, or the names
    of those that are."""
    def is_per_token(name: str) -> bool:
        return per_token if isinstance(per_token, bool) else name in per_token

    trimmed = {name: is_per_token(name) for name in outputs}
    return [{name: (value[row, :length] if trimmed[name] else value[row]) for name, value in outputs.items()}
            for row, length in enumerate(lengths)]


def pad(items: Sequence[ModelItem], batch: Batch) -> dict[str, np.ndarray]:
    """The padded int64 feeds of one batch."""
    return pad_batch([items[i] for i in batch.members], pad_to=batch.width)  # type: ignore[misc]


def run_batch(runner: Runner, items: Sequence[ModelItem], batch: Batch, per_token: bool | Collection[str],
              feeds: dict[str, np.ndarray] | None = None, keeps: Sequence[Keep | None] | None = None) -> list[Rows]:
    """One forward pass: pad (unless `feeds` were padded ahead), run, and the members' own rows in order, each
    through its item's Keep (`keeps[i]` for item i; None: the rows as views)."""
    outputs = runner(pad(items, batch) if feeds is None else feeds)
    rows = split_rows(outputs, [len(items[i]) for i in batch.members], per_token)
    if keeps is None:
        return rows
    return [row if keeps[i] is None else keeps[i](items[i], row)  # type: ignore[misc]
            for i, row in zip(batch.members, rows)]


def iter_batches(runner: Runner, items: Sequence[ModelItem], per_token: bool | Collection[str], shape: BatchShape,
                 keep: Keep | None = None) -> Iterator[tuple[Batch, list[Rows]]]:
    """Each planned batch with its members' rows, one pass at a time (the caller keeps what it needs; with
    `keep`, each item's rows are what it makes of them, so no batch's outputs outlive its pass)."""
    keeps = None if keep is None else [keep] * len(items)
    for batch in plan_batches([len(x) for x in items], shape):
        yield batch, run_batch(runner, items, batch, per_token, keeps=keeps)


def run_items(runner: Runner, items: Sequence[ModelItem], per_token: bool | Collection[str], shape: BatchShape,
              keep: Keep | None = None) -> list[Rows]:
    """Every item's rows (through `keep` when given), in the order given."""
    results: list[Rows | None] = [None] * len(items)
    for batch, rows in iter_batches(runner, items, per_token, shape, keep):
        for i, row in zip(batch.members, rows):
            results[i] = row
    return results  # type: ignore[return-value]


def offline_shape(items: Sequence[ModelItem], batch_size: int, pad_multiple: int = 8) -> BatchShape:
    """Offline runs (dev metrics, parity): up to `batch_size` items a pass, padded as the service pads on
    the CPU (to the longest item rounded up to `pad_multiple`), no token budget beyond that."""
    longest = max((len(x) for x in items), default=1)
    width = -(-longest // pad_multiple) * pad_multiple
    return BatchShape([width], max_batch_size=batch_size, max_batch_tokens=batch_size * width,
                      pad_multiple=pad_multiple)


def item_runner(runner_for: Callable[[Sequence[str]], Runner], batch_size: int = 64,
                progress: str | None = None) -> ItemRunner:
    """An ItemRunner from `runner_for(output names)`, a Runner that fetches those outputs: the items run as
    `offline_shape` batches them; with `progress`, each run is reported under that label (tasks/runtime/progress.py)."""
    def run(items: Sequence[ModelItem], output_names: Sequence[str], per_token: bool) -> list[Rows]:
        from tasks.runtime.progress import Progress, counted

        runner = runner_for(output_names)
        with Progress(progress or "", total=len(items), unit="items", enabled=progress is not None) as bar:
            return run_items(counted(runner, bar), items, per_token, offline_shape(items, batch_size))

    return run
