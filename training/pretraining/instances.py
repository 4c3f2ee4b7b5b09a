"""BERT pretraining instances from tokenized documents, as google-research/bert builds them (numpy only).

`create_instances` follows `create_pretraining_data.py` (`create_instances_from_document`): per
document a target length (``max_seq_length - 3``; with probability `short_seq_prob` a random one in
[2, that]), sentences packed until the target is reached, a random sentence boundary splitting the
pack into A and B; half the time B is replaced by a run of sentences from a uniformly random *other*
document ("NotNext", label 1) and the unused sentences are put back for the next instance;
otherwise B is the real continuation ("IsNext", label 0). The pair is truncated longest-first, a
token at a time from a random end, and laid out as ``[CLS] A [SEP] B [SEP]`` with token type 0 up
to the first [SEP] and 1 after it. `dupe_factor` repeats the whole pass with fresh random splits.
As in the original, the target length is drawn once per document, not per instance.

One deviation, on by default: google makes every one-sentence pack NotNext (A needs a sentence of
its own), which on this corpus of long book sentences and short-target documents gives 45% IsNext
instead of 50%. Here a one-sentence pack whose coin says IsNext takes the next sentence as its B
(``single_sentence_not_next=True`` restores the original).

With ``nsp=False`` (the paper's no-NSP ablation, RoBERTa's DOC-SENTENCES packing) an instance is a
single segment ``[CLS] S [SEP]`` of whole consecutive sentences of one document, packed while they
fit in the target; a sentence longer than ``max_seq_length - 2`` is cut into pieces. Its
`next_sentence_label` is -100 (`NOT_SCORED`), which `BertForPreTraining` ignores.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tasks.runtime.tokenizer import CLS, SEP
from training.pretraining.corpus import Document, split_documents
from training.pretraining.masking import IGNORE_INDEX

NOT_SCORED = IGNORE_INDEX  # next_sentence_label of a single-segment (no-NSP) instance


@dataclass
class TokenizedCorpus:
    """All sentences' token ids in one flat array; a document is a run of consecutive sentences.

    Sentence s is ``token_ids[sentence_offsets[s]:sentence_offsets[s + 1]]``; document d holds the
    sentences ``document_offsets[d]`` to ``document_offsets[d + 1] - 1``.
    """

    token_ids: np.ndarray  # (N,) int32
    sentence_offsets: np.ndarray  # (S + 1,) int64, into token_ids
    document_offsets: np.ndarray  # (D + 1,) int64, into sentences
    # (D,) int64: the file each document was cut from (documents of a file are consecutive); None: one each.
    document_sources: np.ndarray | None = None

    @property
    def num_documents(self) -> int:
        return len(self.document_offsets) - 1

    def source_range(self, doc: int) -> tuple[int, int]:
        """[first, end) of the documents cut from the same file as `doc`."""
        if self.document_sources is None:
            return doc, doc + 1
        source = self.document_sources[doc]
        first = int(np.searchsorted(self.document_sources, source, side="left"))
        return first, int(np.searchsorted(self.document_sources, source, side="right"))


def tokenize_documents(
    documents: Sequence[Document], tokenizer: Tokenizer, batch_size: int = 8192
) -> TokenizedCorpus:
    """Encode every sentence once, in batches (`encode_batch_fast`, no special tokens).

    Sentences that encode to nothing are dropped, and so are documents left without sentences (so
    document numbers count the kept documents).
    """
    sentences = [s for d in documents for s in d.sentences]
    lengths = np.empty(len(sentences), dtype=np.int64)
    pieces: list[np.ndarray] = []
    for start in range(0, len(sentences), batch_size):
        encodings = tokenizer.encode_batch_fast(
            sentences[start : start + batch_size], add_special_tokens=False
        )
        ids = [enc.ids for enc in encodings]
        lengths[start : start + len(ids)] = [len(x) for x in ids]
        pieces.append(np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32))
    per_document = np.array([len(d.sentences) for d in documents], dtype=np.int64)
    document_of_sentence = np.repeat(np.arange(len(documents)), per_document)
    kept = lengths > 0
    kept_per_document = np.bincount(document_of_sentence[kept], minlength=len(documents))
    kept_per_document = kept_per_document[kept_per_document > 0]
    kept_documents = np.bincount(document_of_sentence[kept], minlength=len(documents)) > 0
    # The file a document came from: its source up to "#<piece>". Numbered in order of first appearance,
    # so the numbers never decrease along the corpus when each file's documents are consecutive.
    files: dict[str, int] = {}
    sources = np.array([files.setdefault(d.source.split("#")[0], len(files)) for d in documents], dtype=np.int64)
    sources = sources[kept_documents]
    token_ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    return TokenizedCorpus(
        token_ids=token_ids,
        sentence_offsets=np.r_[0, np.cumsum(lengths[kept])].astype(np.int64),
        document_offsets=np.r_[0, np.cumsum(kept_per_document)].astype(np.int64),
        document_sources=sources if len(sources) and np.all(np.diff(sources) >= 0) else None,
    )


@dataclass
class PretrainingInstances:
    """Unmasked instances, stored flat. Instance i is ``input_ids[offsets[i]:offsets[i + 1]]``.

    Its first `segment_a_lengths[i]` tokens (``[CLS] A [SEP]``) have token type 0, the rest type 1.
    `document_a` / `document_b` record the source documents (B's is -1 for a single segment), so
    that NotNext pairs can be checked to really cross documents.
    """

    input_ids: np.ndarray  # (N,) int32
    offsets: np.ndarray  # (I + 1,) int64
    segment_a_lengths: np.ndarray  # (I,) int32
    next_sentence_labels: np.ndarray  # (I,) int8: 0 IsNext, 1 NotNext, -100 not scored
    document_a: np.ndarray  # (I,) int32
    document_b: np.ndarray  # (I,) int32

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def longest(self) -> int:
        return int(self.lengths.max()) if len(self) else 0

    def nsp_label(self, index: int) -> int:
        return int(self.next_sentence_labels[index])

    def sequence(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, token_type_ids) of one instance, int64."""
        ids = self.input_ids[self.offsets[index] : self.offsets[index + 1]].astype(np.int64)
        types = np.zeros_like(ids)
        types[self.segment_a_lengths[index] :] = 1
        return ids, types

    def save(self, path: str | Path) -> None:
        np.savez(path, **asdict(self))

    @classmethod
    def load(cls, path: str | Path) -> PretrainingInstances:
        with np.load(path) as data:
            return cls(**{name: data[name] for name in cls.__dataclass_fields__})


def truncated_lengths(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """google's truncate_seq_pair lengths: drop one token at a time from the longer (B on ties)."""
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return len_a, len_b
    gap = min(excess, abs(len_a - len_b))
    if len_a > len_b:
        len_a -= gap
    else:
        len_b -= gap
    excess -= gap
    return len_a - excess // 2, len_b - (excess - excess // 2)


def _trim(start: int, stop: int, keep: int, rng: np.random.Generator) -> tuple[int, int]:
    """Keep `keep` tokens of [start, stop), each dropped token from the front or back by a coin flip."""
    dropped = stop - start - keep
    front = int(rng.binomial(dropped, 0.5)) if dropped > 0 else 0
    return start + front, start + front + keep


class _InstanceWriter:
    def __init__(self, corpus: TokenizedCorpus, cls_id: int, sep_id: int):
        self.tokens, self.cls, self.sep = corpus.token_ids, np.int32(cls_id), np.int32(sep_id)
        self.pieces: list[np.ndarray] = []
        self.a_lengths: list[int] = []
        self.labels: list[int] = []
        self.docs_a: list[int] = []
        self.docs_b: list[int] = []

    def add(self, a: tuple[int, int], b: tuple[int, int] | None, label: int, doc_a: int, doc_b: int) -> None:
        parts = [[self.cls], self.tokens[a[0] : a[1]], [self.sep]]
        if b is not None:
            parts += [self.tokens[b[0] : b[1]], [self.sep]]
        self.pieces.append(np.concatenate(parts).astype(np.int32))
        self.a_lengths.append(a[1] - a[0] + 2)
        self.labels.append(label)
        self.docs_a.append(doc_a)
        self.docs_b.append(doc_b)

    def finish(self, order: np.ndarray) -> PretrainingInstances:
        lengths = np.array([len(self.pieces[i]) for i in order], dtype=np.int64)
        return PretrainingInstances(
            input_ids=np.concatenate([self.pieces[i] for i in order])
            if len(order)
            else np.zeros(0, np.int32),
            offsets=np.r_[0, np.cumsum(lengths)].astype(np.int64),
            segment_a_lengths=np.array(self.a_lengths, dtype=np.int32)[order],
            next_sentence_labels=np.array(self.labels, dtype=np.int8)[order],
            document_a=np.array(self.docs_a, dtype=np.int32)[order],
            document_b=np.array(self.docs_b, dtype=np.int32)[order],
        )


def _random_other_document(corpus: TokenizedCorpus, doc: int, rng: np.random.Generator) -> int:
    """A uniformly random document of another file (google-research/bert: another document; here a
    document is a ~20,000-character piece of a file, and a piece of the same book is not a random text).
    When every document comes from one file, any other document."""
    first, end = corpus.source_range(doc)
    if end - first >= corpus.num_documents:
        first, end = doc, doc + 1
    other = int(rng.integers(0, corpus.num_documents - (end - first)))
    return other + (end - first) if other >= first else other


def _pairs_from_document(
    corpus: TokenizedCorpus,
    doc: int,
    max_num_tokens: int,
    short_seq_prob: float,
    rng: np.random.Generator,
    out: _InstanceWriter,
    single_sentence_not_next: bool,
) -> None:
    """create_instances_from_document: A/B pairs with IsNext or NotNext from one document."""
    sent, docs = corpus.sentence_offsets, corpus.document_offsets
    first, end = int(docs[doc]), int(docs[doc + 1])
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_num_tokens + 1))
    chunk_start, i = first, first  # the current chunk holds sentences chunk_start .. i
    while i < end:
        if i == end - 1 or sent[i + 1] - sent[chunk_start] >= target:
            not_next = rng.random() < 0.5
            if i == chunk_start and not (not_next or single_sentence_not_next):
                if i + 1 < end:
                    i += 1  # IsNext for a one-sentence chunk: its B is the next sentence
                else:
                    not_next = True
            n_chunk = i + 1 - chunk_start
            a_end = int(rng.integers(1, n_chunk)) if n_chunk >= 2 else 1  # sentences in A
            a = (int(sent[chunk_start]), int(sent[chunk_start + a_end]))
            if n_chunk == 1 or not_next:
                other = _random_other_document(corpus, doc, rng)
                o_first, o_end = int(docs[other]), int(docs[other + 1])
                b_first = int(rng.integers(o_first, o_end))
                need = target - (a[1] - a[0])  # B takes sentences until it reaches this (at least one)
                b_last = int(np.searchsorted(sent[b_first + 1 : o_end + 1], sent[b_first] + max(need, 1)))
                b = (int(sent[b_first]), int(sent[min(b_first + 1 + b_last, o_end)]))
                label, doc_b = 1, other
                i = chunk_start + a_end - 1  # put the unused sentences back
            else:
                b, label, doc_b = (a[1], int(sent[i + 1])), 0, doc
            keep_a, keep_b = truncated_lengths(a[1] - a[0], b[1] - b[0], max_num_tokens)
            out.add(_trim(*a, keep_a, rng), _trim(*b, keep_b, rng), label, doc, doc_b)
            chunk_start = i + 1
        i += 1


def _segments_from_document(
    corpus: TokenizedCorpus,
    doc: int,
    max_num_tokens: int,
    short_seq_prob: float,
    rng: np.random.Generator,
    out: _InstanceWriter,
) -> None:
    """No-NSP packing: whole consecutive sentences while they fit the target; long ones cut in pieces."""
    sent, docs = corpus.sentence_offsets, corpus.document_offsets
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_num_tokens + 1))
    start = int(sent[docs[doc]])
    for i in range(int(docs[doc]), int(docs[doc + 1])):
        stop = int(sent[i + 1])
        if stop - start > target and sent[i] > start:  # sentence i does not fit: close the chunk before it
            out.add((start, int(sent[i])), None, NOT_SCORED, doc, -1)
            start = int(sent[i])
        while stop - start > max_num_tokens:  # a sentence longer than a whole sequence
            out.add((start, start + max_num_tokens), None, NOT_SCORED, doc, -1)
            start += max_num_tokens
    end = int(sent[docs[doc + 1]])
    if end > start:
        out.add((start, end), None, NOT_SCORED, doc, -1)


def create_instances(
    corpus: TokenizedCorpus,
    cls_id: int,
    sep_id: int,
    max_seq_length: int = 128,
    short_seq_prob: float = 0.1,
    nsp: bool = True,
    dupe_factor: int = 1,
    seed: int = 12345,
    single_sentence_not_next: bool = False,
) -> PretrainingInstances:
    """Instances from every document, `dupe_factor` passes, shuffled (see the module docstring)."""
    if nsp and corpus.num_documents < 2:
        raise ValueError("next-sentence prediction needs at least two documents (or use nsp=False)")
    rng = np.random.default_rng(seed)
    out = _InstanceWriter(corpus, cls_id, sep_id)
    for _ in range(dupe_factor):
        for doc in range(corpus.num_documents):
            if nsp:
                _pairs_from_document(
                    corpus, doc, max_seq_length - 3, short_seq_prob, rng, out, single_sentence_not_next
                )
            else:
                _segments_from_document(corpus, doc, max_seq_length - 2, short_seq_prob, rng, out)
    return out.finish(rng.permutation(len(out.pieces)))


def build_pretraining_instances(
    documents: Sequence[Document],
    tokenizer: Tokenizer,
    *,
    max_seq_length: int = 128,
    short_seq_prob: float = 0.1,
    nsp: bool = True,
    dupe_factor: int = 1,
    heldout_fraction: float = 0.0,
    seed: int = 12345,
    single_sentence_not_next: bool = False,
) -> tuple[PretrainingInstances, PretrainingInstances | None]:
    """Split `documents` by documents, tokenize and build (train, held-out or None) instances.

    The held-out part gets at least two documents when `nsp` (its NotNext segments need another).
    `berth pretrain` calls this once per shard of its corpus (training.pretraining.shards); read a small
    corpus whole with `read_documents`.
    """
    train_docs, heldout_docs = split_documents(documents, heldout_fraction, seed, min_heldout=2 if nsp else 1)
    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)

    def build(docs: list[Document], part_seed: int) -> PretrainingInstances:
        return create_instances(tokenize_documents(docs, tokenizer), cls_id, sep_id, max_seq_length, short_seq_prob,
                                nsp, dupe_factor, part_seed, single_sentence_not_next)

    train = build(train_docs, seed)
    heldout = build(heldout_docs, seed + 1) if heldout_docs else None
    return train, heldout
