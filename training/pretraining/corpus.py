"""Raw text -> documents of sentences, the input of BERT pretraining (numpy- and torch-free).

Two file formats are read:

- ``"bert"``: google-research/bert's format, one sentence per line and a blank line between
  documents. Unlike the original script, every file also starts a new document.
- ``"text"`` (the default): plain prose. A paragraph is a block of lines between blank lines, its
  lines joined with spaces, so hard-wrapped books (Gutenberg wraps at ~70 characters) come out
  whole; a file with any line longer than ``WRAP_WIDTH`` characters is taken to hold one
  paragraph per line (the State of the Union and inaugural addresses are written that way). Each
  paragraph is cut into sentences by `split_sentences`, a rule-based splitter.

A document is a file, cut at paragraph boundaries into pieces of at most ``max_document_chars``
characters (default 20,000, about a book chapter or a long Wikipedia article; a longer single
paragraph stays whole). BERT samples the "NotNext" second segment from a uniformly random other
document, so documents of similar size keep that sample spread over the corpus by volume: with
whole files, the 4.3 MB King James Bible would be one of 134 documents, and most NotNext segments
would come from short speeches. Chapter headings are too irregular across books to split on.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from training.errors import UserFacingError

CorpusFormat = Literal["text", "bert"]
# utf-8: every line must be UTF-8 (a line that is not is a bad line); utf-8-or-latin-1: a file (or piece)
# that is not UTF-8 is read as Latin-1 whole, said in the log (some older corpora are ISO-8859-1).
Encoding = Literal["utf-8", "utf-8-or-latin-1"]
BadLinePolicy = Literal["stop", "skip"]  # at a line that cannot be decoded: stop with its file and line, or skip it
WRAP_WIDTH = 100
DEFAULT_MAX_DOCUMENT_CHARS = 20_000

# Words that end with a period without ending a sentence (compared lowercased, without the period).
# "etc" is left out on purpose: it ends sentences more often than not.
ABBREVIATIONS = frozenset(
    """mr mrs ms messrs mme mlle dr prof rev hon st mt ft jr sr sen rep gov gen col maj capt cmdr lt
    sgt adm pres supt insp esq vs v cf ed eds co corp inc ltd bros dept univ assn ave blvd rd
    jan feb mar apr jun jul aug sept oct nov dec e.g i.e a.m p.m a.d b.c u.s u.k u.n u.s.a d.c
    viz al approx""".split()
)
# Abbreviations only before a number ("No. 5", "p. 12"): "said no. Then" ends a sentence.
NUMBER_ABBREVIATIONS = frozenset("no nos vol vols ch chap sec art fig p pp".split())

# A candidate boundary: terminal punctuation, optional closing quotes/brackets, whitespace, and then
# what may start a sentence (an optional opening quote or bracket, then a capital letter or a digit).
_BOUNDARY = re.compile(r"""([.!?]+)(["'\u201d\u2019)\]]*)(\s+)(?=["'\u201c\u2018(\[]*[A-Z0-9])""")
_TRAILING_WORD = re.compile(r"[\w.']*$")
_INITIALISM = re.compile(r"^(?:[A-Za-z]\.)*[A-Za-z]$")  # U.S (of "U.S."), e.g, a single initial "S"


@dataclass(frozen=True)
class Document:
    """A run of sentences in reading order; `source` says where it came from: "path#i" for the i-th
    piece of a text file, "path@i" for the i-th document of a bert-format file."""

    sentences: list[str]
    source: str


def _ends_with_abbreviation(text: str, period_at: int, next_at: int) -> bool:
    """True when the period at `period_at` closes an abbreviation or an initial, not a sentence.

    `next_at` is where the next word starts.
    """
    word = _TRAILING_WORD.search(text[max(0, period_at - 40) : period_at]).group(0).lstrip("'")
    lower = word.lower()
    if lower in ABBREVIATIONS:
        return True
    if lower in NUMBER_ABBREVIATIONS:
        return text[next_at : next_at + 1].isdigit()
    # Initials and initialisms: "Harry S. Truman", "G. K. Chesterton", "U.S.". A lone capital other
    # than "I" ("so am I. But") is taken for an initial.
    return bool(_INITIALISM.match(word)) and (len(word) > 1 or (word.isupper() and word != "I"))


def split_sentences(text: str) -> list[str]:
    """Cut a paragraph into sentences by rule: terminal punctuation, then a capitalised start.

    No boundary after abbreviations (Mr. Dr. St. U.S. e.g. ...) or initials; decimals ("3.14") and
    punctuation followed by a lowercase word (`"Stop!" he said.`) never split; closing quotes and
    brackets stay with their sentence. Whitespace runs (including line breaks) become one space.
    """
    text = " ".join(text.split())
    sentences: list[str] = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        punct = m.group(1)
        if punct == "." and _ends_with_abbreviation(text, m.start(1), m.end(3)):
            continue
        sentence = text[start : m.end(2)].strip()
        if sentence:
            sentences.append(sentence)
        start = m.end(3)
    rest = text[start:].strip()
    if rest:
        sentences.append(rest)
    return sentences


def split_paragraphs(text: str) -> list[str]:
    """Paragraphs of plain text: blank-line blocks with wrapped lines joined, or one per line.

    One paragraph per line when any line is longer than ``WRAP_WIDTH`` (the text is not hard-wrapped).
    """
    lines = [line.strip() for line in text.splitlines()]
    if any(len(line) > WRAP_WIDTH for line in lines):
        return [line for line in lines if line]
    paragraphs, block = [], []
    for line in lines + [""]:
        if line:
            block.append(line)
        elif block:
            paragraphs.append(" ".join(block))
            block = []
    return paragraphs


@dataclass
class DecodedText:
    text: str
    bad_lines: list[dict]  # {"file", "line", "reason"} of each line skipped
    latin1: bool = False  # read as Latin-1 (encoding utf-8-or-latin-1, and not UTF-8)


def decode_text(data: bytes, path: str | Path, first_line: int | Callable[[], int] = 1, encoding: Encoding = "utf-8",
                bad_lines: BadLinePolicy = "stop") -> DecodedText:
    """The text of `data` (a file, or a piece of one starting at line `first_line`: a number, or a function that
    counts it, called only when a line is bad) by `encoding`; a line that is not UTF-8 stops the read with its
    file and line (`bad_lines="stop"`) or is left out and reported (`"skip"`)."""
    try:
        return DecodedText(data.decode("utf-8"), [])
    except UnicodeDecodeError:
        if encoding == "utf-8-or-latin-1":
            return DecodedText(data.decode("latin-1"), [], latin1=True)
    start = first_line() if callable(first_line) else first_line
    kept: list[str] = []
    skipped: list[dict] = []
    for number, line in enumerate(data.split(b"\n"), start=start):
        try:
            kept.append(line.decode("utf-8"))
        except UnicodeDecodeError as error:
            reason = f"not UTF-8 (byte 0x{line[error.start]:02x} at column {error.start + 1})"
            if bad_lines == "stop":
                raise UserFacingError(
                    f"{path}:{number}: {reason}; --bad-lines skip leaves such lines out (counted), --encoding "
                    "utf-8-or-latin-1 reads a file that is not UTF-8 as Latin-1") from None
            skipped.append({"file": str(path), "line": number, "reason": reason})
    return DecodedText("\n".join(kept), skipped)


def corpus_files(paths: str | Path | Iterable[str | Path], suffixes: Sequence[str] = (".txt",)) -> list[Path]:
    """Files given directly, plus files under given folders (recursively) whose name ends in a suffix.

    Sorted within each folder so that the order, hence every seeded choice later, is reproducible.
    Folder files without a listed suffix (e.g. a corpus README) are skipped.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(tuple(suffixes)))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such corpus file or folder")
    return files


def _chunk_paragraphs(paragraphs: list[list[str]], source: str, max_chars: int | None) -> list[Document]:
    """Group consecutive paragraphs (lists of sentences) into documents of at most `max_chars`."""
    documents: list[Document] = []
    sentences: list[str] = []
    size = 0
    for paragraph in paragraphs:
        length = sum(len(s) + 1 for s in paragraph)
        if sentences and max_chars is not None and size + length > max_chars:
            documents.append(Document(sentences, source))
            sentences, size = [], 0
        sentences += paragraph
        size += length
    if sentences:
        documents.append(Document(sentences, source))
    if len(documents) > 1:
        documents = [Document(d.sentences, f"{source}#{i}") for i, d in enumerate(documents)]
    return documents


def _bert_format_documents(text: str, source: str) -> list[Document]:
    documents, sentences = [], []
    for line in text.splitlines() + [""]:
        line = line.strip()
        if line:
            sentences.append(line)
        elif sentences:
            documents.append(Document(sentences, f"{source}@{len(documents)}"))  # a document, not a piece
            sentences = []
    return documents


def documents_from_text(text: str, source: str, format: CorpusFormat = "text",
                        max_document_chars: int | None = DEFAULT_MAX_DOCUMENT_CHARS) -> list[Document]:
    """The documents of one file's text (or of a piece of it cut at a blank line); see the module docstring.

    `max_document_chars` applies to the "text" format only (a "bert" file marks its own documents).
    """
    if format == "bert":
        return _bert_format_documents(text, source)
    if format == "text":
        paragraphs = [s for s in (split_sentences(p) for p in split_paragraphs(text)) if s]
        return _chunk_paragraphs(paragraphs, source, max_document_chars)
    raise ValueError(f"unknown corpus format {format!r}; use 'text' or 'bert'")


def read_documents(
    paths: str | Path | Iterable[str | Path],
    format: CorpusFormat = "text",
    max_document_chars: int | None = DEFAULT_MAX_DOCUMENT_CHARS,
    suffixes: Sequence[str] = (".txt",),
    encoding: Encoding = "utf-8",
    bad_lines: BadLinePolicy = "stop",
) -> list[Document]:
    """Read whole files and folders (recursively) into documents, in memory: for small corpora and tests.
    `berth pretrain` reads its corpus piece by piece instead (training.pretraining.shards)."""
    documents: list[Document] = []
    for file in corpus_files(paths, suffixes):
        text = decode_text(file.read_bytes(), file, encoding=encoding, bad_lines=bad_lines).text
        documents += documents_from_text(text, str(file), format, max_document_chars)
    return documents


def split_documents(
    documents: Sequence[Document], heldout_fraction: float, seed: int = 0, min_heldout: int = 1
) -> tuple[list[Document], list[Document]]:
    """A seeded random split into (train, held-out) by whole documents, order kept within each.

    When `heldout_fraction` > 0, at least `min_heldout` documents are held out, and at least one
    is left for training.
    """
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    n_heldout = round(len(documents) * heldout_fraction)
    if heldout_fraction > 0 and len(documents) > 1:
        n_heldout = min(max(n_heldout, min_heldout), len(documents) - 1)
    heldout = set(random.Random(seed).sample(range(len(documents)), n_heldout))
    train = [d for i, d in enumerate(documents) if i not in heldout]
    return train, [d for i, d in enumerate(documents) if i in heldout]
