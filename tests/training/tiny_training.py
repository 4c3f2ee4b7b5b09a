"""A tiny BERT on seeded random tokens, for the trainer tests; also runnable as a script.

As a script it trains in this process (under torchrun: as one rank of a DDP run) and, at the end,
writes rank-<r>.json with the sha256 of this rank's final weights. With --hang-after-step N the
dataset blocks forever once the metrics log reaches step N (after writing a "hanging" marker), so
that a test can SIGKILL the process mid-epoch, a real kill after a real checkpoint.

    python -m tests.training.tiny_training OUT [--hang-after-step N] [--settings JSON]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from training.bert.model import BertConfig, BertForPreTraining, BertForSequenceClassification

VOCAB = 200
SEQ_LEN = 12


def tiny_config(dropout: float = 0.1) -> BertConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout)


def tiny_pretraining_model(seed: int = 0, dropout: float = 0.1) -> BertForPreTraining:
    torch.manual_seed(seed)
    return BertForPreTraining(tiny_config(dropout))


def tiny_classifier(seed: int = 0, dropout: float = 0.0) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    return BertForSequenceClassification(tiny_config(dropout))


class MaskedTokens:
    """Random token sequences with MLM labels re-drawn per epoch (as dynamic masking does) and NSP labels."""

    def __init__(self, size: int = 44, seed: int = 0, hang_after_step: int | None = None,
                 metrics: Path | None = None) -> None:
        rng = np.random.default_rng(seed)
        self.tokens = rng.integers(5, VOCAB, size=(size, SEQ_LEN))
        self.lengths_ = rng.integers(SEQ_LEN // 2, SEQ_LEN + 1, size=size)
        self.seed, self.epoch = seed, 0
        self.hang_after_step, self.metrics = hang_after_step, metrics
        self.epochs_seen: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epochs_seen.append(epoch)

    def __len__(self) -> int:
        return len(self.tokens)

    def lengths(self) -> list[int]:
        return [int(n) for n in self.lengths_]

    def __getitem__(self, index: int) -> dict:
        if self.hang_after_step is not None:
            self._maybe_hang()
        rng = np.random.default_rng([self.seed, self.epoch, index])
        length = int(self.lengths_[index])
        ids = self.tokens[index, :length].copy()
        labels = np.full(length, -100)
        masked = rng.random(length) < 0.3
        masked[rng.integers(length)] = True
        labels[masked] = ids[masked]
        ids[masked] = 4  # a [MASK]-like id
        return {"input_ids": ids, "labels": labels, "next_sentence_label": int(index % 2)}

    def _maybe_hang(self) -> None:
        if not self.metrics.is_file():
            return
        steps = [json.loads(line).get("step", 0) for line in self.metrics.read_text().splitlines() if line.strip()]
        if steps and max(steps) >= self.hang_after_step:
            (self.metrics.parent / "hanging").write_text(str(os.getpid()))
            while True:
                time.sleep(60)


def collate(items: list[dict]) -> dict[str, torch.Tensor]:
    width = max(len(item["input_ids"]) for item in items)
    ids = torch.zeros(len(items), width, dtype=torch.long)
    labels = torch.full((len(items), width), -100, dtype=torch.long)
    mask = torch.zeros(len(items), width, dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        ids[row, :n] = torch.as_tensor(item["input_ids"])
        labels[row, :n] = torch.as_tensor(item["labels"])
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids), "labels": labels,
            "next_sentence_label": torch.tensor([item["next_sentence_label"] for item in items])}


class LabelledTokens:
    """Random sequences with a binary label; no randomness per epoch. Fixed length unless variable_lengths."""

    def __init__(self, size: int = 48, seed: int = 0, variable_lengths: bool = False) -> None:
        rng = np.random.default_rng(seed)
        self.tokens = torch.as_tensor(rng.integers(5, VOCAB, size=(size, SEQ_LEN)))
        self.labels = torch.as_tensor(self.tokens[:, 0] % 2)
        sizes = rng.integers(2, SEQ_LEN + 1, size=size) if variable_lengths else np.full(size, SEQ_LEN)
        self.sizes = [int(n) for n in sizes]

    def __len__(self) -> int:
        return len(self.tokens)

    def lengths(self) -> list[int]:
        return list(self.sizes)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tokens[index, : self.sizes[index]], self.labels[index]


def collate_labelled(items: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in items)
    ids = torch.zeros(len(items), width, dtype=torch.long)
    mask = torch.zeros(len(items), width, dtype=torch.long)
    for row, (tokens, _) in enumerate(items):
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.stack([y for _, y in items])}


def state_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()



def save_tiny_bert_folder(folder: Path, max_position_embeddings: int = 512) -> Path:
    """A 2-layer H32 BERT (random weights, seed 0) saved as a model folder with the default base's tokenizer: a
    real `--base` for fine-tuning runs that must be quick."""
    from training.bert.checkpoint import default_base_path, save_pretrained
    from training.bert.model import BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=max_position_embeddings)
    save_pretrained(BertModel(config), folder, tokenizer_from=default_base_path())
    return folder

def main() -> None:
    from training.loop.settings import TrainSettings
    from training.loop.trainer import train

    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--task", choices=["pretraining", "classification"], default="pretraining")
    parser.add_argument("--hang-after-step", type=int, default=None)
    parser.add_argument("--settings", default="{}", help="TrainSettings fields as JSON")
    parser.add_argument("--variable-lengths", action="store_true", help="classification: sequences of 2..12 tokens")
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = TrainSettings(output_dir=args.out, progress_bar=False, **json.loads(args.settings))
    if args.task == "pretraining":
        model = tiny_pretraining_model()
        dataset = MaskedTokens(hang_after_step=args.hang_after_step, metrics=args.out / "metrics.jsonl")
        result = train(model, dataset, collate, settings)
    else:
        model = tiny_classifier()
        result = train(model, LabelledTokens(variable_lengths=args.variable_lengths), collate_labelled, settings)
    rank = int(os.environ.get("RANK", "0"))
    record = {"rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "hash": state_hash(model),
              "result": result.to_dict()}
    (args.out / f"rank-{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
