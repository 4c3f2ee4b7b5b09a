"""Named-entity recognition as token classification: labels, features, windows, entities.

Training works on pre-split words (CoNLL): the words are joined with single spaces, tokenized,
and each word's label goes on its first sub-token (-100, ignored by the loss, elsewhere). BERT's
pre-tokenizer also splits at punctuation, so its word ids are not the CoNLL words: tokens are
mapped to words by character offsets instead.

Serving works on raw text of any length: `ner_windows` cuts the token sequence of the whole text
into overlapping windows of `max_seq_length` tokens (nothing is truncated), and `decode_entities`
merges their logits, taking each token's logits from the window where the token has the most
context on both sides (the "max context" rule of BERT's run_squad.py; averaging would mix in the
predictions made with little context at window edges), then aggregates tokens into entities as
transformers' TokenClassificationPipeline does, with rules of its own for hyphens and for characters
that became [UNK] at entity edges (see `decode_entities`). Offsets are Python str indices into the
caller's text, and an entity's end never splits a grapheme cluster.

Why one file of ~600 lines: labels, windows, entity decoding and the task definition are one task's steps, kept
together as every task module is (tasks/definition.py); its metric is already its own (tasks/ner_metrics.py).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field
from tokenizers import Tokenizer

from tasks import readers
from tasks.common import OFFSETS_NOTE, LabelSet, margin, softmax
from tasks.definition import Endpoint, ListOf, Prepared, RowLayout, StructOf, TaskDefinition, columns
from tasks.ner_metrics import OUTSIDE, split_tag
from tasks.runtime.graphemes import extend_end
from tasks.runtime.tokenizer import CLS, SEP, UNK, EncodedInput, encode

IGNORE_INDEX = -100  # label of the tokens the loss ignores (PyTorch's CrossEntropyLoss default)
AGGREGATIONS = ("none", "simple", "first", "average", "max")


def ner_label_list(tag_sequences: Iterable[Sequence[str]]) -> list[str]:
    """The IOB2 label list for the tags found: "O" first, then B- and I- of each type by name.

    Both B- and I- are listed for every type, even one only seen as B-, so that any entity
    type can be predicted with more than one word.
    """
    types = set()
    for tags in tag_sequences:
        for tag in tags:
            prefix, entity_type = split_tag(tag)
            if prefix in ("B", "I") and entity_type:
                types.add(entity_type)
            elif tag != OUTSIDE:
                raise ValueError(f"tag {tag!r} is not O, B-TYPE or I-TYPE")
    return [OUTSIDE] + [f"{prefix}-{t}" for t in sorted(types) for prefix in ("B", "I")]


# -- training and evaluation on pre-split words ----------------------------------------------------


@dataclass(frozen=True)
class WordEncoding:
    """A sentence of words encoded as one BERT input, with the token <-> word correspondence."""

    encoded: EncodedInput
    text: str  # the words joined by single spaces
    word_spans: list[tuple[int, int]]  # (start, end) of each word in `text`
    token_words: np.ndarray  # (T,) the word of each token, -1 for [CLS] / [SEP]
    first_tokens: np.ndarray  # (W,) each word's first token, -1 if it has none (truncated, or no tokens)

    @property
    def num_words(self) -> int:
        return len(self.word_spans)


def encode_words(tokenizer: Tokenizer, words: Sequence[str], max_length: int | None = 128) -> WordEncoding:
    """Encode pre-split words; with `max_length`, the words past the limit are truncated away."""
    text = " ".join(words)
    lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    word_starts = np.concatenate(([0], np.cumsum(lengths + 1)[:-1])) if len(words) else lengths
    encoded = encode(tokenizer, text, max_length=max_length)
    is_content = np.fromiter((s is not None for s in encoded.sequence_ids), dtype=bool, count=len(encoded))
    token_starts = np.fromiter((s for s, _ in encoded.offsets), dtype=np.int64, count=len(encoded))
    token_words = np.searchsorted(word_starts, token_starts, side="right") - 1
    token_words[~is_content] = -1
    is_first = is_content.copy()
    is_first[1:] &= token_words[1:] != token_words[:-1]
    first_tokens = np.full(len(words), -1, dtype=np.int64)
    first_tokens[token_words[is_first]] = np.flatnonzero(is_first)
    spans = [(int(s), int(s + n)) for s, n in zip(word_starts, lengths)]
    return WordEncoding(encoded, text, spans, token_words, first_tokens)


def align_labels(
    encoded: WordEncoding,
    word_labels: Sequence[int] | Sequence[str],
    label_all_tokens: bool = False,
    labels: Sequence[str] | LabelSet | None = None,
) -> list[int]:
    """One label id per token: each word's label on its first sub-token, IGNORE_INDEX elsewhere
    (special tokens, later sub-tokens).

    With `label_all_tokens` the later sub-tokens get the word's label too, a B-X turned into I-X
    (as transformers' run_ner.py) when `labels` is given. Word labels may be ids or tag names
    (names need `labels`).
    """
    if len(word_labels) != encoded.num_words:
        raise ValueError(f"{len(word_labels)} labels for {encoded.num_words} words")
    label_set = labels if isinstance(labels, LabelSet) or labels is None else LabelSet(labels)
    if len(word_labels) and isinstance(word_labels[0], str):
        if label_set is None:
            raise ValueError("word labels given as names need `labels` to map them to ids")
        word_labels = [label_set.id(x) for x in word_labels]
    ids = np.asarray(word_labels, dtype=np.int64)
    out = np.full(len(encoded.token_words), IGNORE_INDEX, dtype=np.int64)
    if label_all_tokens:
        content = encoded.token_words >= 0
        values = ids[encoded.token_words[content]]
        if label_set is not None:
            b_to_i = np.arange(len(label_set))
            for i, name in enumerate(label_set):
                if name.startswith("B-") and "I-" + name[2:] in label_set:
                    b_to_i[i] = label_set.id("I-" + name[2:])
            values = b_to_i[values]
        out[content] = values
    seen = encoded.first_tokens >= 0
    out[encoded.first_tokens[seen]] = ids[seen]
    return out.tolist()


# -- serving raw text ------------------------------------------------------------------------------


class NERWindows(Sequence[EncodedInput]):
    """Overlapping windows over the tokens of one text; a sequence of `[CLS] ... [SEP]` inputs
    ready for `pad_batch`, plus what decoding needs (token offsets and word ids of the text)."""

    __slots__ = ("text", "items", "starts", "offsets", "word_ids", "unknown")

    def __init__(self, text: str, items: list[EncodedInput], starts: np.ndarray, offsets: np.ndarray,
                 word_ids: np.ndarray, unknown: np.ndarray | None = None):
        self.text = text
        self.items = items
        self.starts = starts  # (K,) the text token each window begins with
        self.offsets = offsets  # (N, 2) character span of each text token
        self.word_ids = word_ids  # (N,) pre-tokenizer word of each text token
        # (N,) the token is the vocabulary's unknown token ([UNK]): the tokenizer did not understand its characters
        self.unknown = np.zeros(len(offsets), dtype=bool) if unknown is None else unknown

    @property
    def num_tokens(self) -> int:
        return len(self.offsets)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index):  # type: ignore[override]
        return self.items[index]

    def __iter__(self) -> Iterator[EncodedInput]:
        return iter(self.items)


def window_starts(num_tokens: int, window: int, stride: int) -> list[int]:
    """First token of each window of `window` tokens, consecutive windows sharing `stride` tokens;
    the last window ends at the last token (so it has full left context)."""
    if num_tokens <= window:
        return [0]
    return list(range(0, num_tokens - window, window - stride)) + [num_tokens - window]


def ner_windows(tokenizer: Tokenizer, text: str, max_seq_length: int = 128, stride: int = 32) -> NERWindows:
    """Cover all of `text` with windows of at most `max_seq_length` tokens ([CLS] and [SEP] included)
    overlapping by `stride` tokens. The text is tokenized once."""
    window = max_seq_length - 2
    if window < 1:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for text tokens")
    if not 0 <= stride < window:
        raise ValueError(f"stride (the overlap) must be in [0, {window}) for max_seq_length={max_seq_length}")
    enc = tokenizer.encode(text, add_special_tokens=False)
    ids, offsets, word_ids = enc.ids, enc.offsets, enc.word_ids
    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
    starts = window_starts(len(ids), window, stride)
    items = []
    for start in starts:
        end = min(start + window, len(ids))
        n = end - start
        items.append(EncodedInput(
            [cls_id, *ids[start:end], sep_id],
            [0] * (n + 2),
            [(0, 0), *offsets[start:end], (0, 0)],
            [None, *([0] * n), None],
            [None, *word_ids[start:end], None],
            False,
        ))
    offsets_array = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    word_array = np.asarray([-1 if w is None else w for w in word_ids], dtype=np.int64)
    unk_id = tokenizer.token_to_id(getattr(tokenizer.model, "unk_token", None) or UNK)
    unknown = np.asarray(ids, dtype=np.int64) == (-1 if unk_id is None else unk_id)
    return NERWindows(text, items, np.asarray(starts, dtype=np.int64), offsets_array, word_array, unknown)


def merge_window_logits(windows: NERWindows, logits_per_window: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """(N, C) logits for the N text tokens, each from the window where it has the most context
    (min of tokens to its left and right in the window; the earlier window wins ties).

    `logits_per_window[k]` is (T_k, C) for window k, [CLS] first; rows past the window (padding)
    are ignored, so a padded (K, T, C) batch works too.
    """
    if len(logits_per_window) != len(windows):
        raise ValueError(f"{len(logits_per_window)} logit arrays for {len(windows)} windows")
    num_labels = np.shape(logits_per_window[0])[-1]
    merged = np.zeros((windows.num_tokens, num_labels), dtype=np.float32)
    best = np.full(windows.num_tokens, -1, dtype=np.int64)
    for item, start, logits in zip(windows.items, windows.starts.tolist(), logits_per_window):
        length = len(item) - 2
        logits = np.asarray(logits)
        if logits.ndim != 2 or logits.shape[0] < length + 2:
            raise ValueError(f"window logits of shape {logits.shape} for a window of {length + 2} tokens")
        position = np.arange(length)
        context = np.minimum(position, length - 1 - position)
        better = context > best[start : start + length]
        merged[start : start + length][better] = logits[1 : length + 1][better]
        best[start : start + length][better] = context[better]
    return merged


# Hyphens join the parts of one name ("Jean-Pierre", "Coca-Cola"): hyphen-minus, the Unicode hyphen and
# non-breaking hyphen, the small and full-width hyphen-minus, and the Armenian, Hebrew (maqaf), Mongolian,
# Fraktur double and katakana double hyphens. Dashes (en, em) are not hyphens: they separate ("Paris–Berlin").
HYPHENS = frozenset("-\u2010\u2011\u058a\u05be\u1806\u2e17\ufe63\uff0d\u30a0")


@dataclass(frozen=True)
class _Units:
    """What grouping decides on: tokens (`simple`) or words (`first` / `average` / `max`), in text order."""

    label_ids: np.ndarray  # (U,) the unit's label
    scores: np.ndarray  # (U,) the unit's score for that label
    starts: np.ndarray  # (U,) character span of the unit
    ends: np.ndarray
    head_end: np.ndarray  # (U,) end of the unit's first token
    tail_start: np.ndarray  # (U,) start of the unit's last token
    unknown_head: np.ndarray  # (U,) the unit's first token is [UNK]
    unknown_tail: np.ndarray  # (U,) the unit's last token is [UNK]


def _clusters(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The grapheme clusters of text[start:end] (the last one cut at `end`), see tasks.runtime.graphemes."""
    out = []
    while start < end:
        stop = min(max(extend_end(text, start + 1), start + 1), end)
        out.append((start, stop))
        start = stop
    return out


def _trimmed_start(text: str, units: _Units, u: int) -> int | None:
    """Where an entity beginning with unit `u` begins: past the leading clusters of its [UNK] token that are
    not alphanumeric; None when nothing of the unit is left."""
    if not units.unknown_head[u]:
        return int(units.starts[u])
    head_end = int(units.head_end[u])
    for s, _ in _clusters(text, int(units.starts[u]), int(units.ends[u])):
        if s >= head_end or text[s].isalnum():
            return s
    return None


def _trimmed_end(text: str, units: _Units, u: int) -> int | None:
    """Where an entity ending with unit `u` ends: before the trailing clusters of its [UNK] token that are
    not alphanumeric; None when nothing of the unit is left."""
    if not units.unknown_tail[u]:
        return int(units.ends[u])
    tail_start = int(units.tail_start[u])
    for s, e in reversed(_clusters(text, int(units.starts[u]), int(units.ends[u]))):
        if e <= tail_start or text[s].isalnum():
            return e
    return None


def _is_hyphen(text: str, units: _Units) -> np.ndarray:
    """(U,) the unit is one hyphen character."""
    out = np.zeros(len(units.starts), dtype=bool)
    for u in np.flatnonzero(units.ends - units.starts == 1).tolist():
        out[u] = text[units.starts[u]] in HYPHENS
    return out


def _no_space(text: str, start: int, end: int) -> bool:
    """Nothing but characters the normalizer dropped (combining marks, joiners) between two units, no space."""
    return not any(ch.isspace() for ch in text[start:end])


@dataclass(frozen=True)
class _LabelTable:
    """What the grouping reads of a label set, by label id: made once per label set, not per text."""

    type_ids: np.ndarray  # the tag's type as a number (B-PER and I-PER alike), O its own
    entity_names: list[str]  # what an entity is called (and ignored by)
    is_begin: np.ndarray  # a B- tag
    types: list[str]  # the tag's type as a name
    inside: dict[str, int]  # type -> the id of its I- tag
    members: dict[str, list[int]]  # type -> the ids of its tags


@functools.lru_cache(maxsize=64)
def _label_table(names: tuple[str, ...]) -> _LabelTable:
    types = [n[2:] if n.startswith(("B-", "I-")) else n for n in names]
    return _LabelTable(type_ids=np.unique(np.array(types, dtype=object), return_inverse=True)[1],
                       entity_names=[n.split("-", 1)[-1] for n in names],
                       is_begin=np.array([n.startswith("B-") for n in names], dtype=bool), types=types,
                       inside={t: names.index("I-" + t) for t in set(types) if "I-" + t in names},
                       members={t: [i for i, other in enumerate(types) if other == t] for t in set(types)})


def _group_entities(text: str, units: _Units, names: list[str], ignore_labels: Sequence[str]) -> list[dict]:
    """transformers' group_entities, then the hyphen and edge rules of `decode_entities`.

    transformers: adjacent units of one type merge unless the next is B-; the entity is named by the type of
    its first unit and scored by the mean of its units.
    """
    label_ids = units.label_ids
    table = _label_table(tuple(names))
    type_ids = table.type_ids[label_ids]
    entity_names = table.entity_names
    is_begin = table.is_begin[label_ids]
    new_group = np.ones(len(label_ids), dtype=bool)
    new_group[1:] = (type_ids[1:] != type_ids[:-1]) | is_begin[1:]

    # A hyphen with no space on either side, between two units of one entity type, joins them.
    is_hyphen = _is_hyphen(text, units)
    joiner = np.zeros(len(label_ids), dtype=bool)
    for h in np.flatnonzero(is_hyphen[1:-1]).tolist():
        before, h, after = h, h + 1, h + 2
        if (type_ids[before] == type_ids[after] and entity_names[label_ids[before]] not in ignore_labels
                and _no_space(text, int(units.ends[before]), int(units.starts[h]))
                and _no_space(text, int(units.ends[h]), int(units.starts[after]))):
            joiner[h] = True
            new_group[h] = new_group[after] = False

    first = np.flatnonzero(new_group)
    last = np.r_[first[1:], len(label_ids)] - 1
    scores = units.scores.astype(np.float64)
    entities = []
    for f, la in zip(first.tolist(), last.tolist()):
        name, group_type = entity_names[label_ids[f]], type_ids[f]
        if name in ignore_labels:
            continue
        # The edges: no hyphen, no character of an [UNK] that is not alphanumeric.
        start = end = None
        while f <= la:
            start = None if is_hyphen[f] else _trimmed_start(text, units, f)
            if start is not None:
                break
            f += 1
        while la >= f:
            end = None if is_hyphen[la] else _trimmed_end(text, units, la)
            if end is not None:
                break
            la -= 1
        if f > la or start is None or end is None:
            continue
        # A joining hyphen counts in the score only when the model tagged it with the entity's type.
        counted = [u for u in range(f, la + 1) if not joiner[u] or type_ids[u] == group_type]
        end = extend_end(text, end)
        entities.append({"entity": name, "score": float(scores[counted].mean()), "text": text[start:end],
                         "start": start, "end": end})
    return entities


def _one_type_per_word(scores: np.ndarray, label_ids: np.ndarray, token_scores: np.ndarray, word_ids: np.ndarray,
                       names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each word's later tokens continue what its first token says (`simple`'s word rule): I-X after B-X or
    I-X, O after O. The model was trained with each word's label on its first token only (the later ones are
    ignored by the loss), so their own tags are untrained guesses. A later token whose own tag has the word's
    type keeps its score; one that disagreed is scored by the probability it gives the word's type (B-X + I-X,
    or O), so the disagreement shows in the entity's score."""
    label_ids, token_scores = label_ids.copy(), token_scores.copy()
    later = np.flatnonzero(np.r_[False, word_ids[1:] == word_ids[:-1]] & (word_ids >= 0))
    if not len(later):
        return label_ids, token_scores
    table = _label_table(tuple(names))
    types, inside, members = table.types, table.inside, table.members
    for i in later.tolist():  # in text order: a word's first token is settled before its later ones
        word_type = types[label_ids[i - 1]]
        if types[label_ids[i]] != word_type:
            token_scores[i] = scores[i, members[word_type]].sum()
        label_ids[i] = inside.get(word_type, label_ids[i - 1])
    return label_ids, token_scores


def decode_entities(
    text: str,
    windows: NERWindows,
    logits_per_window: Sequence[np.ndarray] | np.ndarray,
    labels: Sequence[str] | LabelSet,
    aggregation: str = "simple",
    ignore_labels: Sequence[str] = (OUTSIDE,),
) -> list[dict]:
    """Entities `{"entity", "score", "text", "start", "end"}` in text order, `text[start:end]` being
    the entity's text (Python str indices into `text`). Aggregation as transformers'
    TokenClassificationPipeline:

    - `none`: one result per token, `entity` the raw tag (B-PER, ...), the token's own span (an [UNK]
      with all its characters; the end moved past any combining accent the normalizer stripped);
    - `simple`: tokens grouped into entities (`entity` the type): B-X I-X I-X is one entity,
      B-X B-X two; the score is the mean of the token scores. Unlike the pipeline's `simple`, an entity
      never begins or ends inside a word: a word's later tokens continue its first token's tag (the
      one the model was trained to predict) and are scored by the probability they give that type, so
      the spans are those of `first` ("Cupertino" tagged cup=B-ORG ##ert=B-LOC ##ino=I-LOC is one ORG);
    - `first` / `average` / `max`: first each word (pre-tokenizer word: split at spaces and
      punctuation) gets one label, from its first token's scores, from the average of its tokens'
      scores, or from its most confident token; then words are grouped as in `simple`.

    The grouped strategies then apply three rules of their own, where the pipeline would return
    characters that are not part of a name:

    1. Hyphens. A hyphen (see `HYPHENS`; not a dash) with no space on either side, between two units
       (tokens or words) tagged with the same entity type, is inside that entity, and the unit after it
       continues the entity even when tagged B-: "Jean-Pierre Müller-Lüdenscheidt" tagged
       B-PER O B-PER I-PER O I-PER is one PER. Why: BERT's pre-tokenizer cuts "Müller-Lüdenscheidt"
       into three words, but the model was trained on whitespace-separated words (CoNLL) whose label sits
       on the first token: the hyphen and the part after it are later tokens of one word, trained as I-X
       or not at all, so their own B- or O is noise, while the same type on both sides is the evidence.
       So "Paris-Berlin" with both cities tagged LOC is one LOC, as CoNLL (one tag per such word) has it.
       A hyphen between different types, between a tagged and an untagged unit, or with a space next to
       it joins nothing: it is in an entity only where the model's own tags put it inside one, never at
       an edge (rule 2: "Paris-based" gives "Paris", even with the hyphen tagged I-LOC).
    2. Edges. An entity never begins or ends with a hyphen, nor with a character that became [UNK] and is
       not alphanumeric (letters and digits of any script): such characters are trimmed off its edges, a
       unit left empty is dropped (and its score with it), an entity left empty is dropped. The
       WordPiece [UNK] stands for a whole pre-tokenizer word ("🚀Acme" is one [UNK]), so a tag on it is
       about the word's letters at best: the emoji the vocabulary does not know is no evidence of a
       name ("🚀Acme Corp" tagged as an ORG gives "Acme Corp"). Inside an entity, an [UNK] the model
       tagged with the entity's type stays ("Acme 🚀 Corp" all ORG is one entity); one it tagged O splits
       the entity as any O does. The pipeline treats an [UNK] as a word of its own (never a subword) too,
       but returns its whole span.
    3. Characters as people see them: trimming removes whole grapheme clusters (an emoji with its
       skin tone, variation selector or zero-width-joiner sequence, a flag), and an entity's end never
       splits one (it moves past combining accents the normalizer stripped, see `tasks.runtime.graphemes`).

    Otherwise spans and scores are the pipeline's: they differ only where these rules apply. The
    entity's score is the mean of its units' scores, a joining hyphen counted only when tagged with the
    entity's type. Tags in `ignore_labels` (entity types, for the grouped strategies) are left out.
    """
    if text != windows.text:
        raise ValueError("the windows were made from a different text")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; use one of {AGGREGATIONS}")
    names = list(labels)
    if windows.num_tokens == 0:
        return []
    scores = softmax(merge_window_logits(windows, logits_per_window))
    if scores.shape[1] != len(names):
        raise ValueError(f"{scores.shape[1]} logits per token but {len(names)} labels")
    starts, ends = windows.offsets[:, 0], windows.offsets[:, 1]

    if aggregation in ("none", "simple"):
        label_ids = scores.argmax(axis=1)
        token_scores = scores[np.arange(len(scores)), label_ids]
        if aggregation == "simple":
            label_ids, token_scores = _one_type_per_word(scores, label_ids, token_scores, windows.word_ids, names)
            units = _Units(label_ids, token_scores, starts, ends, ends, starts, windows.unknown, windows.unknown)
            return _group_entities(text, units, names, ignore_labels)
        ignored = np.array([name in ignore_labels for name in names], dtype=bool)
        keep = np.flatnonzero(~ignored[label_ids])
        entities = []
        for i in keep.tolist():
            start, end = int(starts[i]), extend_end(text, int(ends[i]))
            entities.append({"entity": names[label_ids[i]], "score": float(token_scores[i]),
                             "text": text[start:end], "start": start, "end": end})
        return entities

    word_ids = windows.word_ids
    new_word = np.ones(len(word_ids), dtype=bool)
    new_word[1:] = word_ids[1:] != word_ids[:-1]
    first = np.flatnonzero(new_word)
    last = np.r_[first[1:], len(word_ids)] - 1
    if aggregation == "first":
        word_scores = scores[first]
    elif aggregation == "average":
        word_scores = np.add.reduceat(scores, first, axis=0) / (last - first + 1)[:, None]
    else:  # max: the scores of the word's most confident token (the first one on ties)
        token_max = scores.max(axis=1)
        word_of_token = np.cumsum(new_word) - 1
        is_word_max = token_max == np.maximum.reduceat(token_max, first)[word_of_token]
        candidates = np.flatnonzero(is_word_max)
        chosen = candidates[np.unique(word_of_token[candidates], return_index=True)[1]]
        word_scores = scores[chosen]
    label_ids = word_scores.argmax(axis=1)
    unit_scores = word_scores[np.arange(len(word_scores)), label_ids]
    units = _Units(label_ids, unit_scores, starts[first], ends[last], ends[first], starts[last],
                   windows.unknown[first], windows.unknown[last])
    return _group_entities(text, units, names, ignore_labels)


# -- the task definition -------------------------------------------------------------------------------


class NEROptions(BaseModel):
    aggregation: Literal["simple", "first", "average", "max", "none"] = Field(
        "simple", description="how tokens become entities (as transformers' TokenClassificationPipeline); "
                              "none: one result per token with its raw tag")


def window_overlap(max_seq_length: int, doc_stride: int) -> int:
    """Tokens shared by consecutive NER windows: the spec's doc_stride (an overlap), capped at half a window."""
    return max(0, min(doc_stride, (max_seq_length - 2) // 2))


def word_spans(words: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
    """The words joined by single spaces, and each word's (start, end) in that text."""
    spans, at = [], 0
    for word in words:
        spans.append((at, at + len(word)))
        at += len(word) + 1
    return " ".join(words), spans


def entities_to_word_tags(entities: Sequence[dict], spans: Sequence[tuple[int, int]]) -> list[str]:
    """IOB2 word tags from entity character spans (grouped entities, `entity` the type): every word the
    entity overlaps is in it, its first such word B-, the rest I- (a word already in an earlier
    entity stays there)."""
    tags = [OUTSIDE] * len(spans)
    starts = np.asarray([s for s, _ in spans], dtype=np.int64)
    ends = np.asarray([e for _, e in spans], dtype=np.int64)
    for entity in entities:
        inside = np.flatnonzero((starts < entity["end"]) & (ends > entity["start"]))
        first = True
        for word in inside.tolist():
            if tags[word] == OUTSIDE:
                tags[word] = f"{'B' if first else 'I'}-{entity['entity']}"
                first = False
    return tags


class NERTask(TaskDefinition):
    """A text of any length -> entity spans with character offsets, over overlapping windows; entity F1."""

    name = "ner"
    head_class = "BertForTokenClassification"
    answers_unread_text = True  # no entities
    training_adapter = "NERAdapter"
    feature_based_head = "BertFeatureBasedTokenClassification"
    output_names = ("logits",)
    per_token = True
    endpoints = (Endpoint(
        "/v1/ner", "named_entities", "Named entities with character offsets",
        "A list of `{entity, text, start, end, score}` per input. " + OFFSETS_NOTE,
        request="NERRequest", response="NERResponse",
        inputs_description="a text or a list of texts, of any length up to the character limit: long texts "
                           "are "
                           "read in overlapping windows",
        examples=({"inputs": "Peter Blackburn met officials of the World Health Organization in Geneva."},),
    ),)
    options = NEROptions
    pipeline_tasks = ("token-classification",)
    data_format = "conll"
    parity_examples = 128
    metric_examples = 1000
    agreement = "same entity spans (type, start, end), simple aggregation, per text"
    parity_files = ("conll2003/iob2/valid.txt", "entities/dev.conll")

    def needs_labels(self, problem_type: str | None) -> bool:
        return True

    def prepare(self, tokenizer, spec, raw: str, options) -> Prepared:
        windows = ner_windows(tokenizer, raw, spec.max_seq_length, window_overlap(spec.max_seq_length, spec.doc_stride))
        return Prepared(windows.items, windows)

    def decode(self, tokenizer, spec, prepared, outputs, options) -> list[Any]:
        results = []
        for item, out in zip(prepared, outputs):
            text = item.state.text
            results.append(decode_entities(text, item.state, [o["logits"] for o in out], spec.labels,
                                           aggregation=options.aggregation))
        return results

    def row_layout(self, spec, options) -> RowLayout:
        """`entities`: the input's entities, in text order."""
        entity = StructOf(columns(("entity", "string"), ("text", "string"), ("start", "int64"), ("end", "int64"),
                                  ("score", "float64")))
        return RowLayout(columns(("entities", ListOf(entity))), lambda r: {"entities": r})

    def served_input(self, example: Any) -> str:
        return word_spans(example.tokens)[0]

    def score(self, spec, examples, results) -> tuple[dict[str, float], dict]:
        result = self._conlleval(examples, results)
        flat = {k: float(v) for k, v in result.items() if isinstance(v, int | float)}
        for entity_type, figures in result.get("per_type", {}).items():
            flat[f"{entity_type}_f1"] = float(figures["f1"])
        return flat, {}

    def _conlleval(self, examples, results) -> dict:
        from tasks import ner_metrics

        predicted = [entities_to_word_tags(found, word_spans(ex.tokens)[1]) for ex, found in zip(examples, results)]
        return ner_metrics.conlleval([ex.tags for ex in examples], predicted)

    def report(self, spec, examples, results) -> dict[str, Any]:
        """conlleval's figures per entity type; support: the gold entities of the type."""
        return {"per_type": {entity_type: {"precision": f["precision"], "recall": f["recall"], "f1": f["f1"],
                                           "support": f["n_gold"], "predicted": f["n_predicted"]}
                             for entity_type, f in self._conlleval(examples, results)["per_type"].items()}}

    def headline_metric(self, metrics: dict[str, float]) -> tuple[str, float]:
        return "f1", 100.0

    def parity_answer(self, tokenizer, spec, prepared, outputs) -> Hashable:
        entities = self.decode(tokenizer, spec, [prepared], [outputs], NEROptions())[0]
        return tuple((e["entity"], e["start"], e["end"]) for e in entities)

    def confidence(self, spec, prepared, outputs) -> float:  # the least clear real token of the text
        return float(min(margin(o["logits"]).min() for o in outputs))

    def parity_inputs(self, path: Path | None, size: int) -> list[Any]:
        if path is None:
            return readers.BUILTIN_SENTENCES[:size]
        sentences = [" ".join(e.tokens) for e in readers.read_conll(path)]
        # Mostly single sentences, and one long document (several windows) from the sentences after them.
        texts = sentences[: max(1, size - 1)]
        if size > 1:
            texts.append(" ".join(sentences[size : size + 40]))
        return texts


DEFINITIONS = (NERTask(),)
