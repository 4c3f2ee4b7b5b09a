"""The grid of a sweep: which fine-tuning settings vary, over which values, and the named grids.

A grid maps setting names to lists of values; its cells are the cartesian product, in the order the
keys and values were given. Keys are FinetuneSettings fields, or their short names (`lr`, `batch`:
berth.flags.SHORT_NAMES). Every cell is validated as a whole FinetuneSettings, once, before any training
starts, so a wrong type or an out-of-range value is refused up front with the setting's own message.

Named grids:
- `paper`: the BERT paper's appendix A.3 recommendation: batch {16, 32} x lr {5e-5, 3e-5, 2e-5} x
  epochs {2, 3, 4} (18 cells).
- `paper-glue`: what the paper ran for GLUE: batch 32, 3 epochs, lr {5e-5, 4e-5, 3e-5, 2e-5}.
- `small-bert`: Google's release of the small BERTs (L2..L12, H128..H768): batch {8, 16, 32, 64, 128} x
  lr {3e-4, 1e-4, 5e-5, 3e-5}, 4 epochs (20 cells); small models want higher rates.

Epochs are separate cells: a 2-epoch cell is its own run with its own linear decay to 0, not the
2-epoch point of a 4-epoch run (whose learning rate is still half its peak there).

Torch-free.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from berth.flags import SHORT_NAMES
from training.finetuning.settings import FinetuneSettings

PRESETS: dict[str, dict[str, list]] = {
    "paper": {"learning_rate": [5e-5, 3e-5, 2e-5], "batch_size": [16, 32], "epochs": [2, 3, 4]},
    "paper-glue": {"learning_rate": [5e-5, 4e-5, 3e-5, 2e-5], "batch_size": [32], "epochs": [3]},
    "small-bert": {"learning_rate": [3e-4, 1e-4, 5e-5, 3e-5], "batch_size": [8, 16, 32, 64, 128], "epochs": [4]},
}

# How a trial runs, not what it computes: a continued sweep may change them.
RUNTIME_ONLY = {"num_threads", "progress_bar", "device", "num_workers", "save_every_steps", "save_every_minutes",
                "keep_last_states"}
# Settings that are not hyperparameters of a trial: the sweep owns them (seed: --restarts).
NOT_SWEPT = {"out", "seed", "resume", "task", "train_file", "dev_file"} | RUNTIME_ONLY


class GridError(ValueError):
    """A grid that cannot be swept; the message is one line for the user."""


def canonical_key(key: str) -> str:
    name = SHORT_NAMES.get(key.strip().replace("-", "_"), key.strip().replace("-", "_"))
    if name in NOT_SWEPT:
        hint = " (use --restarts for seeds)" if name == "seed" else ""
        raise GridError(f"grid key {key!r}: {name} is not swept{hint}")
    if name not in FinetuneSettings.model_fields:
        known = ", ".join(sorted(set(FinetuneSettings.model_fields) - NOT_SWEPT))
        raise GridError(f"unknown grid key {key!r}; known: lr, batch, {known}")
    return name


def parse_grid(items: Iterable[str]) -> dict[str, list]:
    """`["paper", "lr=1e-4,5e-5", "epochs=3"]` -> {setting: [values as typed]}; a preset name first, then
    key=values items that replace or add a key. Values stay strings here; `expand` types them."""
    grid: dict[str, list] = {}
    items = [item for item in items if item.strip()]
    if not items:
        raise GridError("empty grid: give key=v1,v2 items or a preset (" + ", ".join(PRESETS) + ")")
    for item in items:
        if "=" not in item:
            if item not in PRESETS:
                raise GridError(f"grid item {item!r}: neither key=v1,v2 nor a preset ({', '.join(PRESETS)})")
            grid.update({key: list(values) for key, values in PRESETS[item].items()})
            continue
        key, _, text = item.partition("=")
        values = [value.strip() for value in text.split(",") if value.strip()]
        grid[canonical_key(key)] = values
    return normalize_grid(grid)


def normalize_grid(grid: Mapping[str, Any]) -> dict[str, list]:
    """A grid from a config file's `grid:` section (values a list or one value) or from parse_grid: keys
    canonical, no empty or duplicated value lists."""
    if not isinstance(grid, Mapping) or not grid:
        raise GridError("empty grid: give at least one setting with values")
    out: dict[str, list] = {}
    for key, values in grid.items():
        name = canonical_key(str(key))
        values = list(values) if isinstance(values, list | tuple) else [values]
        if not values:
            raise GridError(f"grid key {key!r} has no values")
        if len({str(v) for v in values}) != len(values):
            raise GridError(f"grid key {key!r} repeats a value: {values}")
        out[name] = values
    return out


def expand(base: FinetuneSettings, grid: Mapping[str, list]) -> list[dict[str, Any]]:
    """The grid's cells as {setting: typed value}, each validated as FinetuneSettings with the other settings
    of `base` as given. Raises GridError naming the first bad value."""
    keys = list(grid)
    given = base.model_dump(exclude_unset=True)
    cells = []
    for values in itertools.product(*(grid[key] for key in keys)):
        raw = dict(zip(keys, values))
        try:
            settings = FinetuneSettings(**{**given, **raw})
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "settings"
            raise GridError(f"grid cell {_describe(raw)}: {where}: {first['msg']}") from None
        cells.append({key: getattr(settings, key) for key in keys})
    return cells


def size(grid: Mapping[str, list]) -> int:
    count = 1
    for values in grid.values():
        count *= len(values)
    return count


def _describe(cell: Mapping[str, Any]) -> str:
    return " ".join(f"{key}={value}" for key, value in cell.items())


def describe(cell: Mapping[str, Any]) -> str:
    """`learning_rate=5e-05 batch_size=16`: a cell as one readable string (the one-cell grid: `(base)`)."""
    return _describe(cell) or "(base)"
