"""WordPiece tokenizer: load a BERT tokenizer, train a new vocabulary, encode with offsets.

Built on the `tokenizers` library so that encoding is the same in training and serving, and
character offsets (Python str indices into the caller's text) come for free.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Encoding, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from tokenizers.trainers import WordPieceTrainer

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = SPECIAL_TOKENS


def _bert_pipeline(tokenizer: Tokenizer, lowercase: bool, strip_accents: bool | None) -> Tokenizer:
    """Attach BERT normalization, pre-tokenization, [CLS]/[SEP] post-processing and decoding."""
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def from_vocab(vocab_file: str | Path, lowercase: bool = True, strip_accents: bool | None = None) -> Tokenizer:
    """A BERT tokenizer from a `vocab.txt` (one token per line, the line number is the id)."""
    vocab: dict[str, int] = {}
    with open(vocab_file, encoding="utf-8") as f:
        for i, line in enumerate(f):
            vocab[line.rstrip("\n")] = i
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise ValueError(f"{vocab_file}: vocabulary lacks the special tokens {missing}")
    tok = Tokenizer(WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=100))
    return _bert_pipeline(tok, lowercase, strip_accents)


def _lowercase_from_folder(folder: Path) -> bool:
    """Read `do_lower_case` from a Hugging Face tokenizer_config.json when there is one."""
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        return bool(json.loads(cfg.read_text(encoding="utf-8")).get("do_lower_case", True))
    return True


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load from a `tokenizer.json` file, a `vocab.txt` file, or a folder holding either.

    A folder's `tokenizer.json` wins over its `vocab.txt`, as in Hugging Face. Any padding or
    truncation stored in the file is switched off: berth pads and truncates explicitly (see `encode`).
    """
    tok = _load(Path(path))
    tok.no_padding()
    tok.no_truncation()
    return tok


def _load(path: Path) -> Tokenizer:
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return Tokenizer.from_file(str(path / "tokenizer.json"))
        if (path / "vocab.txt").is_file():
            return from_vocab(path / "vocab.txt", lowercase=_lowercase_from_folder(path))
        raise FileNotFoundError(f"{path}: no tokenizer.json or vocab.txt in this folder")
    if path.name.endswith(".json"):
        return Tokenizer.from_file(str(path))
    if path.is_file():
        return from_vocab(path)
    raise FileNotFoundError(f"{path}: no such tokenizer file or folder")


def plain_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """A copy with no truncation and no padding configured, so encoding never drops text silently."""
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.no_truncation()
    tok.no_padding()
    return tok


def _read_lines(files: Iterable[str | Path]) -> Iterator[str]:
    for file in files:
        with open(file, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if line:
                    yield line


def train_wordpiece(
    files: Iterable[str | Path] = (),
    vocab_size: int = 30522,
    lowercase: bool = True,
    strip_accents: bool | None = None,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    lines: Iterable[str] | None = None,
) -> Tokenizer:
    """Train a WordPiece vocabulary on raw text files (or on `lines`, already read), with BERT normalization.

    `lowercase=True` also strips accents (BERT uncased); pass `lowercase=False` for a cased model.
    The special tokens take ids 0-4 in the order [PAD] [UNK] [CLS] [SEP] [MASK].
    """
    files = [str(f) for f in files]
    tok = Tokenizer(WordPiece(unk_token=UNK, max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(_read_lines(files) if lines is None else lines, trainer=trainer)
    return _bert_pipeline(tok, lowercase, strip_accents)


def save_tokenizer(tokenizer: Tokenizer, folder: str | Path, lowercase: bool = True) -> None:
    """Write `tokenizer.json`, `vocab.txt` and a Hugging Face `tokenizer_config.json` into a folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    plain_tokenizer(tokenizer).save(str(folder / "tokenizer.json"))
    vocab = tokenizer.get_vocab()
    ordered = sorted(vocab, key=vocab.__getitem__)
    (folder / "vocab.txt").write_text("\n".join(ordered) + "\n", encoding="utf-8")
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase,
        "unk_token": UNK,
        "sep_token": SEP,
        "pad_token": PAD,
        "cls_token": CLS,
        "mask_token": MASK,
        "model_max_length": 512,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


class GilFreeTokenizer:
    """A `tokenizers.Tokenizer` whose `encode` goes through `encode_batch`, which releases the GIL while
    Rust tokenizes: a 100,000-character text tokenized in a worker thread no longer stalls the event
    loop for the whole call (`Tokenizer.encode` holds the GIL throughout). Everything else is delegated."""

    def __init__(self, tokenizer: Tokenizer):
        self.inner = tokenizer

    def encode(self, sequence: Any, pair: Any = None, is_pretokenized: bool = False,
               add_special_tokens: bool = True) -> Any:
        item = sequence if pair is None else (sequence, pair)
        return self.inner.encode_batch([item], is_pretokenized=is_pretokenized,
                                       add_special_tokens=add_special_tokens)[0]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")


class EncodedInput:
    """One encoded `[CLS] A [SEP] (B [SEP])` sequence with its provenance.

    `offsets[i]` is the (start, end) character span of token i in the text it came from
    (`sequence_ids[i]` says which: 0 for A, 1 for B, None for a special token, whose span is (0, 0)).
    `offsets` and `word_ids` are None for an item encoded without them (`encode_many(spans=False)`).
    """

    __slots__ = ("input_ids", "token_type_ids", "offsets", "sequence_ids", "word_ids", "truncated", "dropped")

    def __init__(self, input_ids, token_type_ids, offsets, sequence_ids, word_ids, truncated, dropped=0):
        self.input_ids: list[int] = input_ids
        self.token_type_ids: list[int] = token_type_ids
        self.offsets: list[tuple[int, int]] | None = offsets
        self.sequence_ids: list[int | None] = sequence_ids
        self.word_ids: list[int | None] | None = word_ids
        self.truncated: bool = truncated
        self.dropped: int = dropped  # tokens cut by truncation (0 when `truncated` is False)

    def __len__(self) -> int:
        return len(self.input_ids)


def truncation(item: EncodedInput) -> dict[str, Any]:
    """What a result says of its input's truncation: `truncated` and how many tokens were cut."""
    return {"truncated": item.truncated, "truncated_tokens": item.dropped}


def _truncate_lengths(len_a: int, len_b: int, budget: int, strategy: str) -> tuple[int, int]:
    """How many tokens of A and B to keep so that len_a + len_b <= budget."""
    if strategy not in TRUNCATION_STRATEGIES:
        raise ValueError(f"unknown truncation strategy {strategy!r}; use one of {TRUNCATION_STRATEGIES}")
    if len_a + len_b <= budget:
        return len_a, len_b
    if strategy == "only_first":
        return max(0, budget - len_b), len_b
    if strategy == "only_second":
        return len_a, max(0, budget - len_a)
    # longest_first: remove one token at a time from the longer sequence (BERT's rule).
    keep_a, keep_b = len_a, len_b
    excess = len_a + len_b - budget
    while excess > 0:
        if keep_a > keep_b:
            keep_a -= 1
        else:
            keep_b -= 1
        excess -= 1
    return keep_a, keep_b


def encode(
    tokenizer: Tokenizer,
    text: str,
    text_pair: str | None = None,
    max_length: int | None = 512,
    truncation: str = "longest_first",
) -> EncodedInput:
    """Encode a text or a pair as BERT input, truncating to `max_length` tokens by `truncation`.

    The tokenizer's own truncation and padding settings are ignored (it is shared across threads).
    `truncated` is True when any token was dropped. The list path with a list of one (`encode_many`).
    """
    return encode_many(tokenizer, [text], None if text_pair is None else [text_pair], max_length, truncation)[0]


def encode_many(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    text_pairs: Sequence[str | None] | None = None,
    max_length: int | None = 512,
    truncation: str = "longest_first",
    spans: bool = True,
) -> list[EncodedInput]:
    """`encode` of each (text, text pair), with ONE `encode_batch` call for all their distinct texts.

    `encode_batch` releases the GIL for the whole list and saves the per-call overhead of encoding the
    texts one by one; a text that repeats (a multiple-choice context) is tokenized once.

    `spans=False`, for a task that reads only the token ids (classification, pairs, choices, sentence vectors):
    `encode_batch_fast`, which does not track character offsets (the same ids, 15-30% less tokenizing), and
    the items have no `offsets` or `word_ids` (None).
    """
    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
    encode_batch = tokenizer.encode_batch if spans else ids_batch_encoder(tokenizer)
    if text_pairs is None:  # single texts: no bookkeeping (one input is the hot path)
        encodings = encode_batch(list(texts), add_special_tokens=False) if texts else []
        return [_assemble(encoding, None, cls_id, sep_id, max_length, truncation, spans) for encoding in encodings]
    if len(text_pairs) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(text_pairs)} text pairs")
    distinct = list(dict.fromkeys([*texts, *(pair for pair in text_pairs if pair is not None)]))
    by_text = dict(zip(distinct, encode_batch(distinct, add_special_tokens=False))) if distinct else {}
    return [_assemble(by_text[text], None if pair is None else by_text[pair], cls_id, sep_id, max_length,
                      truncation, spans) for text, pair in zip(texts, text_pairs)]


def ids_batch_encoder(tokenizer: Tokenizer) -> Any:
    """The tokenizer's `encode_batch` for a caller that reads only the ids: `encode_batch_fast` (no character
    offsets tracked) where the installed tokenizers has it."""
    return getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)


def _assemble(enc_a: Encoding, enc_b: Encoding | None, cls_id: int, sep_id: int, max_length: int | None,
              truncation: str, spans: bool = True) -> EncodedInput:
    """`[CLS] A [SEP] (B [SEP])` from the texts' encodings without special tokens, truncated to max_length;
    without `spans`, no `offsets` or `word_ids` (None)."""
    ids_a, ids_b = enc_a.ids, (enc_b.ids if enc_b is not None else None)
    len_a, len_b = len(ids_a), (len(ids_b) if ids_b is not None else 0)
    n_special = 3 if ids_b is not None else 2
    budget = (max_length - n_special) if max_length is not None else len_a + len_b
    if budget < 0:
        raise ValueError(f"max_length={max_length} leaves no room for the special tokens")
    keep_a, keep_b = _truncate_lengths(len_a, len_b, budget, truncation)

    ids = [cls_id, *ids_a[:keep_a], sep_id]
    types = [0] * (keep_a + 2)
    seq_ids: list[int | None] = [None, *([0] * keep_a), None]
    if ids_b is not None:
        ids += [*ids_b[:keep_b], sep_id]
        types += [1] * (keep_b + 1)
        seq_ids += [*([1] * keep_b), None]
    offsets: list[tuple[int, int]] | None = None
    word_ids: list[int | None] | None = None
    if spans:
        offsets = [(0, 0), *enc_a.offsets[:keep_a], (0, 0)]
        word_ids = [None, *enc_a.word_ids[:keep_a], None]
        if enc_b is not None:
            offsets += [*enc_b.offsets[:keep_b], (0, 0)]
            word_ids += [*enc_b.word_ids[:keep_b], None]
    dropped = (len_a - keep_a) + (len_b - keep_b)
    return EncodedInput(ids, types, offsets, seq_ids, word_ids, dropped > 0, dropped)
