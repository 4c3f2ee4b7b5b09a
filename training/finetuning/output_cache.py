"""A model's outputs on a set of inputs, kept beside the weights that made them.

`berth finetune` ends by scoring the saved weights on the whole dev file; export's metric gate then needs the
same PyTorch outputs again as its reference (on the rerank default, 47 s of its 6 minutes). The finetune folder
keeps them in `dev_outputs.npz`, under a key made of the weights, the model's configuration, the device type
and every input token; a runner wrapped in `Reusing` answers a call from the file only when its key matches
exactly, and runs the model otherwise. The outputs are the same numbers either way: the cache changes time,
never a figure.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from tasks.runtime.inference import ItemRunner, ModelItem, Rows

log = logging.getLogger(__name__)

CACHE_FILE = "dev_outputs.npz"
# Outputs larger than this are not kept (SQuAD v1.1's whole dev set, 10,570 questions in 384-token windows,
# is about 33 MB): the file would cost more to write and read than the evaluation it saves.
MAX_BYTES = 256 * 2**20
# Configuration fields that name or date the model rather than change what it computes.
_NOT_COMPUTED = {"_name_or_path", "transformers_version", "architectures", "torch_dtype", "dtype",
                 "_attn_implementation_autoset"}


def model_digest(model: torch.nn.Module) -> str:
    """Weights (every tensor of the state dict: name, dtype, shape, bytes), class, configuration and device
    type: what decides the outputs."""
    digest = hashlib.blake2b(digest_size=20)
    config = getattr(model, "config", None)
    settings = {k: v for k, v in (config.to_dict() if config is not None else {}).items() if k not in _NOT_COMPUTED}
    digest.update(json.dumps([type(model).__name__, settings], sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())  # reshape: a 0-dim one has no view
    digest.update(next(model.parameters()).device.type.encode())
    return digest.hexdigest()


def call_key(model_key: str, items: Sequence[ModelItem], output_names: Sequence[str], per_token: bool) -> str:
    """The model's digest with every item's token ids and segments, the outputs asked for and their trimming."""
    digest = hashlib.blake2b(model_key.encode(), digest_size=20)
    digest.update(json.dumps([list(output_names), per_token, len(items)]).encode())
    for item in items:
        for ids in (item.input_ids, item.token_type_ids):
            array = np.asarray(ids, dtype=np.int64)
            digest.update(len(array).to_bytes(8, "little") + array.tobytes())
    return digest.hexdigest()


class Recorder:
    """An ItemRunner that runs `run` and keeps each call's rows, to `save` with the weights that made them."""

    def __init__(self, run: ItemRunner) -> None:
        self.run = run
        self.calls: list[tuple[Sequence[ModelItem], list[str], bool, list[Rows]]] = []

    def __call__(self, items: Sequence[ModelItem], output_names: Sequence[str], per_token: bool) -> list[Rows]:
        rows = self.run(items, output_names, per_token)
        self.calls.append((items, list(output_names), per_token, rows))
        return rows

    def save(self, path: Path, model: torch.nn.Module) -> Path | None:
        """Write the recorded calls under `model`'s digest: the weights as they are now and the device they are
        on, so call it before any change to either (a model evaluated on a GPU and then moved to the CPU would
        otherwise file GPU outputs under the CPU's key); nothing when nothing was recorded."""
        if not self.calls:
            return None
        size = sum(np.asarray(row[name]).nbytes for _, names, _, rows in self.calls for row in rows for name in names)
        if size > MAX_BYTES:
            log.info("dev outputs not kept: %.0f MB, over the %d MB limit", size / 2**20, MAX_BYTES // 2**20)
            return None
        model_key = model_digest(model)
        arrays: dict[str, np.ndarray] = {}
        keys = []
        for n, (items, names, per_token, rows) in enumerate(self.calls):
            keys.append(call_key(model_key, items, names, per_token))
            for name in names:
                values = [np.asarray(row[name]) for row in rows]
                ndim = values[0].ndim if values else 0
                arrays[f"{n}/{name}/shapes"] = np.array([v.shape for v in values], dtype=np.int64).reshape(
                    len(values), ndim)
                arrays[f"{n}/{name}/data"] = (np.concatenate([v.ravel() for v in values]) if values
                                              else np.zeros(0, np.float32))
        arrays["keys"] = np.array(keys)
        with open(path, "wb") as file:  # np.savez would add ".npz" to a name without it
            np.savez(file, **arrays)
        return path


def _rows(stored, n: int, names: Sequence[str]) -> list[Rows]:
    columns = {}
    for name in names:
        shapes, data = stored[f"{n}/{name}/shapes"], stored[f"{n}/{name}/data"]
        ends = np.cumsum([int(np.prod(shape)) for shape in shapes])
        columns[name] = [part.reshape(tuple(shape)) for part, shape in zip(np.split(data, ends[:-1]), shapes)]
    count = len(stored[f"{n}/{names[0]}/shapes"]) if names else 0
    return [{name: columns[name][i] for name in names} for i in range(count)]


class Reusing:
    """`run`, answering from `path` (a `Recorder.save` file) any call whose key it holds: the same weights,
    configuration, device type, inputs and outputs asked for. The digest is taken at the first call; `reused`
    counts the calls answered from the file."""

    def __init__(self, run: ItemRunner, model: torch.nn.Module, path: Path) -> None:
        self.run, self.model, self.path = run, model, Path(path)
        self.model_key: str | None = None
        self.reused = 0

    def __call__(self, items: Sequence[ModelItem], output_names: Sequence[str], per_token: bool) -> list[Rows]:
        if self.path.is_file():
            self.model_key = self.model_key or model_digest(self.model)
            key = call_key(self.model_key, items, output_names, per_token)
            try:
                with np.load(self.path, allow_pickle=False) as stored:
                    keys = list(stored["keys"])
                    if key in keys:
                        rows = _rows(stored, keys.index(key), output_names)
                        log.info("reused the outputs of these weights on these %d inputs from %s", len(items),
                                 self.path)
                        self.reused += 1
                        return rows
            except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as error:  # damaged or foreign
                log.warning("%s unreadable (%s); running the model instead", self.path, error)
        return self.run(items, output_names, per_token)
