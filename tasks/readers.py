"""Read data sets into examples: GLUE TSVs, a user's CSV / TSV / JSON lines, CoNLL column files.

Every reader fails on malformed input with a ValueError that names the file and the 1-based line.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.ner_metrics import iob1_to_iob2, split_tag, starts_chunk_with_inside

Label = str | float | None


@dataclass(frozen=True, slots=True)
class TextExample:
    text: str
    text_pair: str | None = None
    label: Label = None


@dataclass(frozen=True, slots=True)
class NERExample:
    tokens: list[str]
    tags: list[str]
    line: int = field(default=0, compare=False)  # where the sentence starts in its file (1-based)


def _error(path: str | Path, line: int, message: str) -> ValueError:
    return ValueError(f"{path}:{line}: {message}")


def _open(path: str | Path):
    # utf-8-sig: the MRPC files (and many CSVs written on Windows) start with a byte-order mark.
    return open(path, encoding="utf-8-sig", newline="")


# -- GLUE ------------------------------------------------------------------------------------------

# GLUE task -> (text column, pair column or None, label column, label is a float)
GLUE_COLUMNS: dict[str, tuple[str, str | None, str, bool]] = {
    "sst2": ("sentence", None, "label", False),
    "mrpc": ("#1 String", "#2 String", "Quality", False),
    "rte": ("sentence1", "sentence2", "label", False),
    "stsb": ("sentence1", "sentence2", "score", True),
}


def read_glue(path: str | Path, task: str) -> list[TextExample]:
    """A GLUE TSV with a header (train.tsv / dev.tsv of sst2, mrpc, rte, stsb).

    A file without the label column (a GLUE test file) gives examples whose label is None.
    """
    if task not in GLUE_COLUMNS:
        raise ValueError(f"unknown GLUE task {task!r}; known: {sorted(GLUE_COLUMNS)}")
    text_col, pair_col, label_col, is_float = GLUE_COLUMNS[task]
    return read_table(path, text_col, pair_col, label_col, regression=is_float, delimiter="\t")


def read_sst2(path: str | Path) -> list[TextExample]:
    """GLUE SST-2: `sentence<TAB>label` with a header; labels "0" / "1"."""
    return read_glue(path, "sst2")


def read_mrpc(path: str | Path) -> list[TextExample]:
    """GLUE MRPC: `Quality<TAB>#1 ID<TAB>#2 ID<TAB>#1 String<TAB>#2 String`; labels "0" / "1"."""
    return read_glue(path, "mrpc")


# -- the user's own tables ---------------------------------------------------------------------------


def _label(value: Any, regression: bool, path: str | Path, line: int) -> Label:
    if value is None or value == "":
        return None
    if regression:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise _error(path, line, f"label {value!r} is not a number (regression)") from None
    if isinstance(value, (dict, list)):
        raise _error(path, line, f"label {value!r} is not a single value")
    return str(value).strip()


def _text(value: Any, column: str, path: str | Path, line: int, required: bool) -> str | None:
    if value is None:
        if required:
            raise _error(path, line, f"no {column!r} value")
        return None
    if not isinstance(value, str):
        raise _error(path, line, f"{column!r} is {type(value).__name__}, not text")
    return value


def _table_rows(path: str | Path, delimiter: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, row as a dict) for a CSV (RFC 4180 quoting) or a TSV (no quoting), header first."""
    with _open(path) as f:
        if delimiter == ",":
            reader = csv.reader(f)
            rows = ((reader.line_num, row) for row in reader)
        else:
            rows = ((n, line.rstrip("\r\n").split("\t")) for n, line in enumerate(f, start=1))
        header: list[str] | None = None
        for number, row in rows:
            if not row or row == [""]:
                continue
            if header is None:
                header = row
                continue
            if len(row) != len(header):
                raise _error(path, number, f"{len(row)} fields but the header has {len(header)}")
            yield number, dict(zip(header, row))
        if header is None:
            raise _error(path, 1, "empty file: expected a header line")


def _jsonl_rows(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with _open(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise _error(path, number, f"invalid JSON: {e.msg}") from None
            if not isinstance(row, dict):
                raise _error(path, number, "expected a JSON object per line")
            yield number, row


def _format_of(path: str | Path) -> str:
    suffixes = [s.lower() for s in Path(path).suffixes]
    for suffix in reversed(suffixes):
        if suffix in (".csv", ".tsv", ".jsonl", ".json", ".ndjson"):
            return {".json": "jsonl", ".ndjson": "jsonl"}.get(suffix, suffix[1:])
    raise ValueError(f"{path}: cannot tell the format from the name; use .csv, .tsv or .jsonl")


def read_table(
    path: str | Path,
    text_column: str = "text",
    text_pair_column: str | None = "text_pair",
    label_column: str | None = "label",
    regression: bool = False,
    delimiter: str | None = None,
) -> list[TextExample]:
    """Examples from a CSV, TSV (header line first) or JSON lines file (one object per line).

    The format comes from the file name (.csv, .tsv, .jsonl / .json) unless `delimiter` is given
    ("," or "\\t"). A TSV is split on tabs with no quoting (the GLUE convention); a CSV follows RFC
    4180. The pair and label columns are optional: an absent column gives None, and so does an
    empty label cell (an unlabelled example). Labels are kept as strings (class names, stripped),
    or floats with `regression`.
    """
    fmt = {",": "csv", "\t": "tsv"}[delimiter] if delimiter else _format_of(path)
    rows = _jsonl_rows(path) if fmt == "jsonl" else _table_rows(path, "," if fmt == "csv" else "\t")
    examples = []
    for number, row in rows:
        if fmt != "jsonl" and not examples and text_column not in row:
            raise _error(path, 1, f"no {text_column!r} column; the columns are {list(row)}")
        text = _text(row.get(text_column), text_column, path, number, required=True)
        pair = _text(row.get(text_pair_column), text_pair_column, path, number, False) if text_pair_column else None
        label = _label(row.get(label_column), regression, path, number) if label_column else None
        examples.append(TextExample(text, pair, label))
    return examples


# -- CoNLL ---------------------------------------------------------------------------------------


def _check_tag(tag: str, path: str | Path, line: int) -> None:
    prefix, entity_type = split_tag(tag)
    if tag != "O" and not (prefix in ("B", "I") and entity_type):
        raise _error(path, line, f"tag {tag!r} is not O, B-TYPE or I-TYPE")


def read_conll(path: str | Path, iob1: bool | None = None) -> list[NERExample]:
    """Sentences of a CoNLL column file: one token per line, the token in the first column and
    the NER tag in the last (CoNLL-2003 `token POS chunk NER`, WNUT-17 `token<TAB>tag`).

    Blank (or whitespace-only) lines end sentences; `-DOCSTART-` lines separate documents and end
    any sentence they follow. Columns are split on tabs if the file's first token line has one,
    else on whitespace; every token line must have as many columns as that first one.

    Tags come back as IOB2. `iob1=True` converts from IOB1 (I- starts entities, B- only between
    two adjacent entities of one type); `iob1=False` requires valid IOB2 (an I- that starts an
    entity is an error); `iob1=None` (auto) converts, which leaves valid IOB2 unchanged.
    """
    sentences: list[NERExample] = []
    tokens: list[str] = []
    tags: list[str] = []
    lines: list[int] = []
    delimiter: str | None = None
    n_columns = 0

    def end_sentence() -> None:
        if not tokens:
            return
        if iob1 is False:
            bad = starts_chunk_with_inside(tags)
            if bad:
                raise _error(path, lines[bad[0]], f"{tags[bad[0]]!r} starts an entity: not IOB2 (IOB1?)")
        fixed = iob1_to_iob2(tags) if iob1 is not False else list(tags)
        sentences.append(NERExample(list(tokens), fixed, lines[0]))
        tokens.clear()
        tags.clear()
        lines.clear()

    with _open(path) as f:
        for number, raw in enumerate(f, start=1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                end_sentence()
                continue
            if delimiter is None:
                delimiter = "\t" if "\t" in line else " "
            columns = line.split("\t") if delimiter == "\t" else line.split()
            if columns[0] == "-DOCSTART-":
                end_sentence()
                continue
            if n_columns == 0:
                if len(columns) < 2:
                    raise _error(path, number, f"expected a token and a tag, got {line!r}")
                n_columns = len(columns)
            elif len(columns) != n_columns:
                raise _error(path, number, f"{len(columns)} columns, expected {n_columns} as on the first line")
            _check_tag(columns[-1], path, number)
            tokens.append(columns[0])
            tags.append(columns[-1])
            lines.append(number)
        end_sentence()
    if not sentences:
        raise ValueError(f"{path}: no sentences found")
    return sentences


def read_wnut17(path: str | Path) -> list[NERExample]:
    """WNUT-17 (`token<TAB>tag`, IOB2 tags such as B-creative-work): read_conll, IOB2 required."""
    return read_conll(path, iob1=False)


# -- the parity gate's inputs ----------------------------------------------------------------------

# Used by the parity gate when neither ../shared/data nor the shipped samples are there (an installed wheel).
BUILTIN_SENTENCES = [
    "The film is a charming and often affecting journey.",
    "Unflinchingly bleak and desperate.",
    "It's slow -- very, very slow.",
    "A sometimes tedious film, but the acting, costumes, music and cinematography are all astounding.",
    "Emma is a novel by Jane Austen, first published in December 1815.",
    "The European Commission said on Thursday it disagreed with German advice to consumers to shun British lamb.",
    "Peter Blackburn met officials of the World Health Organization in Geneva on Monday.",
    "Who wrote the theory of relativity, and when was it published?",
]


def read_sentences(path: Path | None, size: int) -> list[str]:
    """The first `size` texts of an SST-2 TSV or a text table; the built-in sentences without a file."""
    if path is None:
        return BUILTIN_SENTENCES[:size]
    examples = read_sst2(path) if path.suffix == ".tsv" else read_table(path)
    return [e.text for e in examples[:size]]


def read_sentence_pairs(path: Path | None, size: int) -> list[TextExample]:
    """The first `size` text pairs (no labels) of an MRPC TSV or a pair table; built-in pairs without a file."""
    if path is None:
        return [TextExample(a, b) for a, b in zip(BUILTIN_SENTENCES[0::2], BUILTIN_SENTENCES[1::2])][:size]
    rows = read_mrpc(path) if path.suffix == ".tsv" else read_table(path, regression=True)
    return [TextExample(e.text, e.text_pair) for e in rows[:size]]
