"""BERT's masked-LM corruption of one token sequence (numpy only), as google-research/bert does it.

Choose 15% of the maskable tokens (never [CLS], [SEP], [PAD] or [MASK]), at most
`max_predictions_per_seq`; replace 80% of the chosen with [MASK], 10% with a random vocabulary
token, keep 10% unchanged; the labels are the original ids at the chosen positions and -100
elsewhere (the ignore index of the loss). With whole-word masking a word (a token and the `##`
pieces after it) is chosen or skipped as a unit; the 80/10/10 draw is still made per token, as in
the original. One deliberate difference: 15% is of the maskable tokens, not of the whole sequence
with its [CLS]/[SEP] (google's `len(tokens) * masked_lm_prob`), so the rate is what it says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from tasks.runtime.tokenizer import CLS, MASK, PAD, SEP

IGNORE_INDEX = -100
_BRACKETED = re.compile(r"^\[.+\]$")  # [PAD] [UNK] [CLS] [SEP] [MASK] [unused0] ...


@dataclass(frozen=True)
class MaskingVocab:
    """What masking needs to know about a vocabulary.

    `replacement_ids`: the ids a "random token" is drawn from, every token except the bracketed
    ones ([PAD] [UNK] [CLS] [SEP] [MASK] and bert-base's [unused*]), which never occur in text.
    `is_continuation[id]`: the token is a `##` piece that continues the previous word.
    """

    mask_id: int
    never_mask_ids: np.ndarray
    replacement_ids: np.ndarray
    is_continuation: np.ndarray

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> MaskingVocab:
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        size = max(vocab.values()) + 1
        continuation = np.zeros(size, dtype=bool)
        replaceable = np.ones(size, dtype=bool)
        for token, index in vocab.items():
            continuation[index] = token.startswith("##") and len(token) > 2
            replaceable[index] = not _BRACKETED.match(token)
        never = np.array([vocab[t] for t in (PAD, CLS, SEP, MASK)], dtype=np.int64)
        replaceable[never] = False
        return cls(vocab[MASK], never, np.flatnonzero(replaceable), continuation)


@dataclass(frozen=True)
class MaskingSettings:
    """BERT's defaults for 128-token sequences (use max_predictions_per_seq=80 for 512)."""

    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word: bool = False
    mask_token_prob: float = 0.8  # of the chosen tokens: -> [MASK]
    random_token_prob: float = 0.1  # of the chosen tokens: -> a random token; the rest stay as they are


def _word_groups(input_ids: np.ndarray, candidates: np.ndarray, vocab: MaskingVocab) -> list[np.ndarray]:
    """Candidate positions grouped into words: a `##` piece joins the word just before it.

    A piece never joins across a non-candidate position (a segment truncated at its front may start
    with `##` right after [SEP]).
    """
    continues = vocab.is_continuation[input_ids[candidates]]
    adjacent = np.r_[False, np.diff(candidates) == 1]
    starts = np.flatnonzero(~(continues & adjacent))
    return np.split(candidates, starts[1:])


def mask_tokens(
    input_ids: np.ndarray, vocab: MaskingVocab, settings: MaskingSettings, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Mask one sequence; returns (corrupted input ids, labels), both int64 like `input_ids`."""
    input_ids = np.asarray(input_ids, dtype=np.int64)
    candidates = np.flatnonzero(~np.isin(input_ids, vocab.never_mask_ids))
    labels = np.full_like(input_ids, IGNORE_INDEX)
    if candidates.size == 0:
        return input_ids.copy(), labels
    budget = min(settings.max_predictions_per_seq, max(1, round(candidates.size * settings.masked_lm_prob)))

    if settings.whole_word:
        groups = _word_groups(input_ids, candidates, vocab)
        chosen: list[np.ndarray] = []
        n_chosen = 0
        for g in rng.permutation(len(groups)):
            if n_chosen >= budget:
                break
            if n_chosen + groups[g].size > budget:  # skip a word that does not fit, as google does
                continue
            chosen.append(groups[g])
            n_chosen += groups[g].size
        positions = np.sort(np.concatenate(chosen)) if chosen else candidates[:0]
    else:
        positions = np.sort(rng.permutation(candidates)[:budget])

    labels[positions] = input_ids[positions]
    corrupted = input_ids.copy()
    draw = rng.random(positions.size)
    to_mask = draw < settings.mask_token_prob
    to_random = (draw >= settings.mask_token_prob) & (
        draw < settings.mask_token_prob + settings.random_token_prob
    )
    corrupted[positions[to_mask]] = vocab.mask_id
    corrupted[positions[to_random]] = rng.choice(vocab.replacement_ids, size=int(to_random.sum()))
    return corrupted, labels
