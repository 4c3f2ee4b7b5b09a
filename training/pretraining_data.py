"""BERT pretraining data: corpus -> instances (with NSP) -> masked, padded batches.

The pipeline, one module per step: `training.corpus` reads text files into documents of sentences,
`training.pretraining_instances` tokenizes them and builds ``[CLS] A [SEP] B [SEP]`` instances with
next-sentence labels, `training.masking` applies BERT's 80/10/10 masked-LM corruption. This module
ties them together: `build_pretraining_instances` (with a held-out split by documents and an .npz
cache), `PretrainingDataset` and `collate`, whose batch goes straight into `BertForPreTraining(**batch)`.

Masking is dynamic by default: `PretrainingDataset` masks an instance when it is fetched, from
``np.random.default_rng([seed, epoch, index])``, so each epoch has fresh masks and a resumed run
reproduces exactly the same batches. Everything is numpy; torch is imported by `collate` only.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tasks.runtime.tokenizer import CLS, SEP
from training.corpus import (
    DEFAULT_MAX_DOCUMENT_CHARS,
    CorpusFormat,
    Document,
    corpus_files,
    read_documents,
    split_documents,
)
from training.masking import IGNORE_INDEX, MaskingSettings, MaskingVocab, mask_tokens
from training.pretraining_instances import (
    NOT_SCORED,
    PretrainingInstances,
    TokenizedCorpus,
    create_instances,
    tokenize_documents,
)

__all__ = [
    "NOT_SCORED",
    "MaskingSettings",
    "MaskingVocab",
    "PretrainingDataset",
    "PretrainingInstances",
    "TokenizedCorpus",
    "build_pretraining_instances",
    "collate",
    "create_instances",
    "read_documents",
    "split_documents",
    "tokenize_documents",
]

CACHE_FORMAT = 2  # bumped: NotNext segments now come from another file


def _cache_key(files: list[Path], tokenizer: Tokenizer, settings: dict) -> str:
    h = hashlib.sha256(json.dumps({"format": CACHE_FORMAT, **settings}, sort_keys=True).encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    h.update(tokenizer.to_str().encode())
    return h.hexdigest()[:16]


def build_pretraining_instances(
    paths: str | Path | Iterable[str | Path],
    tokenizer: Tokenizer,
    *,
    format: CorpusFormat = "text",
    max_document_chars: int | None = DEFAULT_MAX_DOCUMENT_CHARS,
    max_seq_length: int = 128,
    short_seq_prob: float = 0.1,
    nsp: bool = True,
    dupe_factor: int = 1,
    heldout_fraction: float = 0.0,
    seed: int = 12345,
    single_sentence_not_next: bool = False,
    cache_dir: str | Path | None = None,
) -> tuple[PretrainingInstances, PretrainingInstances | None]:
    """Read, split by documents, tokenize and build (train, held-out or None) instances.

    The held-out part gets at least two documents when `nsp` (its NotNext segments need another).

    With `cache_dir`, the result is saved as ``pretraining-<key>.npz`` (the key hashes the files'
    paths, sizes and mtimes, the tokenizer and every setting) and loaded from there next time.
    """
    settings = dict(
        format=format,
        max_document_chars=max_document_chars,
        max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob,
        nsp=nsp,
        dupe_factor=dupe_factor,
        heldout_fraction=heldout_fraction,
        seed=seed,
        single_sentence_not_next=single_sentence_not_next,
    )
    cache = None
    if cache_dir is not None:
        cache = Path(cache_dir) / f"pretraining-{_cache_key(corpus_files(paths), tokenizer, settings)}.npz"
        if cache.is_file():
            return _load_split(cache)
    documents = read_documents(paths, format=format, max_document_chars=max_document_chars)
    train_docs, heldout_docs = split_documents(documents, heldout_fraction, seed, min_heldout=2 if nsp else 1)
    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)

    def build(docs: list[Document], part_seed: int) -> PretrainingInstances:
        corpus = tokenize_documents(docs, tokenizer)
        return create_instances(
            corpus,
            cls_id,
            sep_id,
            max_seq_length,
            short_seq_prob,
            nsp,
            dupe_factor,
            part_seed,
            single_sentence_not_next,
        )

    train = build(train_docs, seed)
    heldout = build(heldout_docs, seed + 1) if heldout_docs else None
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        arrays = {f"train.{k}": v for k, v in asdict(train).items()}
        if heldout is not None:
            arrays |= {f"heldout.{k}": v for k, v in asdict(heldout).items()}
        tmp = cache.with_suffix(f".{time.time_ns()}.tmp.npz")
        np.savez(tmp, settings=json.dumps(settings), **arrays)
        tmp.replace(cache)  # atomic: a concurrent reader never sees half a file
    return train, heldout


def _load_split(path: Path) -> tuple[PretrainingInstances, PretrainingInstances | None]:
    fields = PretrainingInstances.__dataclass_fields__
    with np.load(path) as data:
        train = PretrainingInstances(**{k: data[f"train.{k}"] for k in fields})
        has_heldout = "heldout.offsets" in data.files
        heldout = PretrainingInstances(**{k: data[f"heldout.{k}"] for k in fields}) if has_heldout else None
    return train, heldout


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
        instances: PretrainingInstances,
        vocab: MaskingVocab | Tokenizer,
        max_seq_length: int = 128,
        masking: MaskingSettings | None = None,
        seed: int = 12345,
        dynamic_masking: bool = True,
    ):
        if len(instances) and int(instances.lengths.max()) > max_seq_length:
            raise ValueError(
                f"an instance has {int(instances.lengths.max())} tokens > max_seq_length={max_seq_length}"
            )
        self.instances = instances
        self.vocab = vocab if isinstance(vocab, MaskingVocab) else MaskingVocab.from_tokenizer(vocab)
        self.max_seq_length = max_seq_length
        self.masking = masking or MaskingSettings()
        self.seed = seed
        self.dynamic_masking = dynamic_masking
        self.epoch = 0

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
            "next_sentence_label": int(self.instances.next_sentence_labels[index]),
        }


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
