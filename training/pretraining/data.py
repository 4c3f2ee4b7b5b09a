"""BERT pretraining data: corpus -> instances (with NSP) -> masked, padded batches.

The pipeline, one module per step: `training.pretraining.corpus` reads text files into documents of sentences,
`training.pretraining.instances` tokenizes them and builds ``[CLS] A [SEP] B [SEP]`` instances with
next-sentence labels, `training.pretraining.masking` applies BERT's 80/10/10 masked-LM corruption. This module
ties them together: `PretrainingDataset` (over instances in memory or over prepared shards) and `collate`,
whose batch goes straight into `BertForPreTraining(**batch)`.

Masking is dynamic by default: `PretrainingDataset` masks an instance when it is fetched, from
``np.random.default_rng([seed, epoch, index])``, so each epoch has fresh masks and a resumed run
reproduces exactly the same batches. Everything is numpy; torch is imported by `collate` only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

from training.pretraining.instances import PretrainingInstances
from training.pretraining.masking import IGNORE_INDEX, MaskingSettings, MaskingVocab, mask_tokens
from training.pretraining.stream import EpochBatches, ShardedInstances


class PretrainingDataset:
    """Masked instances for a `torch.utils.data.DataLoader` (a map-style dataset; no torch needed).

    Item i is masked with ``np.random.default_rng([seed, epoch, i])``: call `set_epoch` before each
    epoch for fresh (dynamic) masks; with ``dynamic_masking=False`` the mask ignores the epoch
    (static masking: build the instances with `dupe_factor` > 1 for several masks per text).
    DataLoader workers copy the dataset when an epoch's iteration starts, so `set_epoch` reaches
    them unless ``persistent_workers=True``.
    """

    def __init__(
        self,
        instances: PretrainingInstances | ShardedInstances,
        vocab: MaskingVocab | Tokenizer,
        max_seq_length: int = 128,
        masking: MaskingSettings | None = None,
        seed: int = 12345,
        dynamic_masking: bool = True,
        shuffle_window: int = 4,
    ):
        if len(instances) and instances.longest > max_seq_length:
            raise ValueError(f"an instance has {instances.longest} tokens > max_seq_length={max_seq_length}")
        self.instances = instances
        self.vocab = vocab if isinstance(vocab, MaskingVocab) else MaskingVocab.from_tokenizer(vocab)
        self.max_seq_length = max_seq_length
        self.masking = masking or MaskingSettings()
        self.seed = seed
        self.dynamic_masking = dynamic_masking
        self.shuffle_window = shuffle_window
        self.epoch = 0
        # What the training loop's resume checks besides the count: prepared data that changed is refused.
        self.fingerprint = getattr(instances, "digest", None)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.instances)

    def __getitem__(self, index: int) -> dict[str, np.ndarray | int]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        input_ids, token_type_ids = self.instances.sequence(index)
        epoch = self.epoch if self.dynamic_masking else 0
        rng = np.random.default_rng([self.seed, epoch, index])
        masked, labels = mask_tokens(input_ids, self.vocab, self.masking, rng)
        return {
            "input_ids": masked,
            "token_type_ids": token_type_ids,
            "labels": labels,
            "next_sentence_label": self.instances.nsp_label(index),
        }


class ShardedPretrainingDataset(PretrainingDataset):
    """`PretrainingDataset` over prepared shards, with the epoch order the training loop takes from it."""

    instances: ShardedInstances

    def epoch_batches(self, epoch: int, rank: int, world_size: int, batch_size: int, seed: int) -> EpochBatches:
        """This rank's micro-batches of `epoch`, made on demand (training.pretraining.stream)."""
        return EpochBatches(self.instances.epoch_order(seed, epoch, self.shuffle_window), rank, world_size,
                            batch_size)


def collate(items: Sequence[dict], pad_to: int | None = None, pad_id: int = 0) -> dict:
    """Right-pad dataset items to the longest (or to `pad_to`) into the `BertForPreTraining` batch.

    Returns int64 torch tensors `input_ids`, `attention_mask`, `token_type_ids`, `labels` (B, T),
    with -100 labels on padding, and `next_sentence_label` (B,).
    """
    import torch

    longest = max((len(item["input_ids"]) for item in items), default=0)
    width = longest if pad_to is None else pad_to
    if width < longest:
        raise ValueError(f"pad_to={pad_to} is shorter than the longest item ({longest} tokens)")
    batch = {
        "input_ids": np.full((len(items), width), pad_id, dtype=np.int64),
        "attention_mask": np.zeros((len(items), width), dtype=np.int64),
        "token_type_ids": np.zeros((len(items), width), dtype=np.int64),
        "labels": np.full((len(items), width), IGNORE_INDEX, dtype=np.int64),
    }
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        batch["input_ids"][row, :n] = item["input_ids"]
        batch["attention_mask"][row, :n] = 1
        batch["token_type_ids"][row, :n] = item["token_type_ids"]
        batch["labels"][row, :n] = item["labels"]
    tensors = {name: torch.from_numpy(array) for name, array in batch.items()}
    tensors["next_sentence_label"] = torch.tensor(
        [item["next_sentence_label"] for item in items], dtype=torch.long
    )
    return tensors
