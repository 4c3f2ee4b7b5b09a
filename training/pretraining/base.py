"""Continued pretraining from a released BERT checkpoint (`berth pretrain --base`): domain-adaptive pretraining,
as BioBERT, SciBERT and "Don't Stop Pretraining" do it.

The base keeps its tokenizer and shape; its encoder is loaded whole. A pretraining head it lacks starts fresh:
a sentence-transformers folder (the embedded default) has no `cls.predictions`, so its masked-LM head is new,
the decoder tied to the base's word embeddings; next-sentence prediction is trained only where the base has a
trained NSP head (`cls.seq_relationship`) or the user asks for it. A new head first trains alone, the encoder
frozen (`head_warmup_steps`), so that its random gradients do not wash over the encoder's weights.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.errors import UserFacingError

log = logging.getLogger("berth.pretrain")

MLM_HEAD = "cls.predictions.transform."
NSP_HEAD = "cls.seq_relationship."
MAX_HEAD_WARMUP_STEPS = 500


@dataclass(frozen=True)
class Base:
    folder: Path
    config: dict[str, Any]
    weights: Path
    has_mlm_head: bool
    has_nsp_head: bool

    @property
    def max_positions(self) -> int:
        return int(self.config.get("max_position_embeddings", 512))

    def digest(self) -> str:
        """sha256 of the weights file: which base, exactly, a run continued from."""
        from training.pretraining.shards import file_sha256

        return file_sha256(self.weights)

    def record(self) -> dict[str, Any]:
        return {"path": str(self.folder), "weights": self.weights.name, "sha256": self.digest(),
                "had_mlm_head": self.has_mlm_head, "had_nsp_head": self.has_nsp_head}


def resolve_base(name: str) -> Base:
    """The base folder `name` ('default': the embedded checkpoint), checked to be a BERT checkpoint with a
    tokenizer; anything else is refused in one line."""
    from training.bert.checkpoint import LEGACY_WEIGHTS_NAME, WEIGHTS_NAME, default_base_path

    folder = default_base_path() if name == "default" else Path(name)
    if not folder.is_dir():
        raise UserFacingError(f"--base {name}: no such folder")
    if not (folder / "config.json").is_file():
        raise UserFacingError(f"--base {folder}: no config.json, so not a Hugging Face BERT checkpoint folder")
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise UserFacingError(f"--base {folder}/config.json: not valid JSON ({error})") from None
    if config.get("model_type", "bert") != "bert":
        raise UserFacingError(f"--base {folder}: model_type {config.get('model_type')!r} is not bert")
    weights = next((folder / n for n in (WEIGHTS_NAME, LEGACY_WEIGHTS_NAME) if (folder / n).is_file()), None)
    if weights is None:
        raise UserFacingError(f"--base {folder}: no {WEIGHTS_NAME} or {LEGACY_WEIGHTS_NAME}")
    if not any((folder / n).is_file() for n in ("tokenizer.json", "vocab.txt")):
        raise UserFacingError(f"--base {folder}: no tokenizer.json or vocab.txt (continued pretraining keeps the "
                              "base's own vocabulary)")
    keys = _weight_names(weights)
    return Base(folder, config, weights, has_mlm_head=any(k.startswith(MLM_HEAD) for k in keys),
                has_nsp_head=any(k.startswith(NSP_HEAD) for k in keys))


def _weight_names(weights: Path) -> list[str]:
    if weights.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(weights), framework="pt") as f:
                return list(f.keys())
        except Exception as error:  # noqa: BLE001 - safetensors raises its own types for a damaged file
            raise UserFacingError(f"--base {weights}: not a readable safetensors file ({error})") from None
    import torch

    return list(torch.load(weights, map_location="cpu", weights_only=True))


def check_lengths(base: Base, *lengths: int | None) -> None:
    """A sequence length past the base's position embeddings cannot be honoured: refused before any work."""
    for length in lengths:
        if length is not None and length > base.max_positions:
            raise UserFacingError(f"sequence length {length} is past the base's {base.max_positions} positions "
                                  f"(max_position_embeddings of {base.folder}); use at most {base.max_positions}")


def load_base_model(base: Base, nsp: bool):
    """The base's weights in `BertForPreTraining` (nsp) or `BertForMaskedLM`, and the names of the new weights."""
    from training.bert.checkpoint import CheckpointError, load_pretrained
    from training.bert.model import BertForMaskedLM, BertForPreTraining

    try:
        model, report = load_pretrained(BertForPreTraining if nsp else BertForMaskedLM, base.folder)
    except (CheckpointError, ValueError) as error:
        raise UserFacingError(f"--base {base.folder}: {error}") from None
    log.info("base %s: %s", base.folder, report)
    model.train()
    return model, [name for name in report.fresh + report.resized if name.startswith("cls.")]


def head_warmup_steps(explicit: int | None, new_heads: list[str], total_steps: int) -> int:
    """Steps of the head-only warm-up: as asked, else 10% of the run (at most 500) when a head is new."""
    if explicit is not None:
        return explicit
    if not new_heads:
        return 0
    return min(MAX_HEAD_WARMUP_STEPS, max(1, total_steps // 10))


@contextlib.contextmanager
def encoder_frozen(model) -> Iterator[None]:
    """Only the heads train: every encoder weight (the word embeddings, and with them the tied MLM decoder)
    is frozen, so the optimizer does not even hold them."""
    frozen = [p for p in model.bert.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)
