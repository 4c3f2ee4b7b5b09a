"""Read data sets into examples: GLUE TSVs, a user's CSV / TSV / JSON lines, CoNLL column files.

Every reader fails on malformed input with a DataError (a ValueError) that names the file and the 1-based line,
undecodable bytes included (the line they are on, not a byte offset). A reader given `BadRows("skip")` reads on
past a bad row (a CoNLL sentence with a bad line is one bad row) and keeps it there, for an errors file; what no
row can fix (an empty file, a missing column) stops either way.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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


class DataError(ValueError):
    """A data file that cannot be read as asked: the file, the 1-based line (0: the whole file) and why."""

    def __init__(self, path: str | Path, line: int, reason: str):
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")
        self.path, self.line, self.reason = str(path), line, reason


@dataclass
class BadRows:
    """What a reader does with a bad row: "stop" raises its DataError; "skip" keeps it here and reads on."""

    policy: Literal["stop", "skip"] = "stop"
    found: list[DataError] = field(default_factory=list)

    def handle(self, error: DataError) -> None:
        if self.policy == "stop":
            raise error
        self.found.append(error)

    def records(self) -> list[dict[str, Any]]:
        """One JSON-able record per bad row, as an errors file holds them."""
        return [{"file": e.path, "line": e.line, "reason": e.reason} for e in self.found]


def _error(path: str | Path, line: int, message: str) -> DataError:
    return DataError(path, line, message)


def _open(path: str | Path):
    # utf-8-sig: the MRPC files (and many CSVs written on Windows) start with a byte-order mark. Undecodable bytes
    # are kept as surrogate escapes so that the row they are in is reported (and can be skipped) by its line.
    try:
        return open(path, encoding="utf-8-sig", errors="surrogateescape", newline="")
    except OSError as error:
        raise DataError(path, 0, f"cannot read: {error.strerror or error}") from None


def undecodable(text: str) -> str | None:
    """Why `text` (read with surrogate escapes) is not UTF-8, naming the first bad byte and where; None if it is."""
    for column, char in enumerate(text, start=1):
        if "\udc80" <= char <= "\udcff":
            return (f"bytes that are not UTF-8 (0x{ord(char) - 0xDC00:02x} at character {column}); "
                    "save the file as UTF-8")
    return None


def first_undecodable_line(path: str | Path) -> str:
    """`path:line: why` for the first line of `path` that is not UTF-8 (for a reader that decoded the whole file)."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if reason := undecodable(raw.decode("utf-8", errors="surrogateescape")):
                return f"{path}:{number}: {reason}"
    return f"{path}: not UTF-8"


# -- GLUE ------------------------------------------------------------------------------------------

# GLUE task -> (text column, pair column or None, label column, label is a float)
GLUE_COLUMNS: dict[str, tuple[str, str | None, str, bool]] = {
    "sst2": ("sentence", None, "label", False),
    "mrpc": ("#1 String", "#2 String", "Quality", False),
    "rte": ("sentence1", "sentence2", "label", False),
    "stsb": ("sentence1", "sentence2", "score", True),
}


def read_glue(path: str | Path, task: str, bad_rows: BadRows | None = None,
              label_required: bool = False) -> list[TextExample]:
    """A GLUE TSV with a header (train.tsv / dev.tsv of sst2, mrpc, rte, stsb).

    A file without the label column (a GLUE test file) gives examples whose label is None.
    """
    if task not in GLUE_COLUMNS:
        raise ValueError(f"unknown GLUE task {task!r}; known: {sorted(GLUE_COLUMNS)}")
    text_col, pair_col, label_col, is_float = GLUE_COLUMNS[task]
    return read_table(path, text_col, pair_col, label_col, regression=is_float, delimiter="\t", bad_rows=bad_rows,
                      label_required=label_required)


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
            number = float(value)
        except (TypeError, ValueError):
            raise _error(path, line, f"label {value!r} is not a number (regression)") from None
        if not math.isfinite(number):
            raise _error(path, line, f"label {value!r} is not a finite number (regression)")
        return number
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


def _table_rows(path: str | Path, delimiter: str, bad: BadRows) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, row as a dict) for a CSV (RFC 4180 quoting) or a TSV (no quoting), header first."""
    with _open(path) as f:
        if delimiter == ",":
            reader = csv.reader(f)
            rows = ((reader.line_num, row) for row in reader)
        else:
            rows = ((n, line.rstrip("\r\n").split("\t")) for n, line in enumerate(f, start=1))
        header: list[str] | None = None
        try:
            for number, row in rows:
                if not row or row == [""]:
                    continue
                if header is None:
                    if reason := undecodable("".join(row)):
                        raise _error(path, number, f"the header has {reason}")
                    header = row
                    continue
                if reason := undecodable("\t".join(row)):
                    bad.handle(_error(path, number, reason))
                elif len(row) != len(header):
                    bad.handle(_error(path, number, f"{len(row)} fields but the header has {len(header)}"))
                else:
                    yield number, dict(zip(header, row))
        except csv.Error as error:  # e.g. a quoted field left open at the end of the file
            raise _error(path, reader.line_num, f"not a valid CSV: {error}") from None
        if header is None:
            raise _error(path, 1, "empty file: expected a header line")


def _jsonl_rows(path: str | Path, bad: BadRows) -> Iterator[tuple[int, dict[str, Any]]]:
    with _open(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if reason := undecodable(line):
                bad.handle(_error(path, number, reason))
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                bad.handle(_error(path, number, f"invalid JSON: {e.msg} (character {e.colno})"))
                continue
            if not isinstance(row, dict):
                bad.handle(_error(path, number, "expected a JSON object per line"))
                continue
            yield number, row


def _format_of(path: str | Path) -> str:
    suffixes = [s.lower() for s in Path(path).suffixes]
    for suffix in reversed(suffixes):
        if suffix in (".csv", ".tsv", ".jsonl", ".json", ".ndjson"):
            return {".json": "jsonl", ".ndjson": "jsonl"}.get(suffix, suffix[1:])
    raise DataError(path, 0, "cannot tell the format from the name; use .csv, .tsv or .jsonl")


def read_table(
    path: str | Path,
    text_column: str = "text",
    text_pair_column: str | None = "text_pair",
    label_column: str | None = "label",
    regression: bool = False,
    delimiter: str | None = None,
    bad_rows: BadRows | None = None,
    label_required: bool = False,
) -> list[TextExample]:
    """Examples from a CSV, TSV (header line first) or JSON lines file (one object per line).

    The format comes from the file name (.csv, .tsv, .jsonl / .json) unless `delimiter` is given
    ("," or "\\t"). A TSV is split on tabs with no quoting (the GLUE convention); a CSV follows RFC
    4180. The pair and label columns are optional: an absent column gives None, and so does an
    empty label cell (an unlabelled example), unless `label_required` (training data): then a row without a
    label is a bad row. Labels are kept as strings (class names, stripped), or floats with `regression`.
    """
    bad = bad_rows if bad_rows is not None else BadRows()
    fmt = {",": "csv", "\t": "tsv"}[delimiter] if delimiter else _format_of(path)
    rows = _jsonl_rows(path, bad) if fmt == "jsonl" else _table_rows(path, "," if fmt == "csv" else "\t", bad)
    examples: list[TextExample] = []
    checked = False
    for number, row in rows:
        if not checked and fmt != "jsonl":  # a column the header lacks is the file's problem, not a row's
            _check_columns(path, row, text_column, label_column if label_required else None)
            checked = True
        try:
            if text_column not in row:
                raise _error(path, number, f"no {text_column!r} field; the row's fields are {list(row)} "
                                           "(name yours with --text-column)")
            text = _text(row.get(text_column), text_column, path, number, required=True)
            pair = _text(row.get(text_pair_column), text_pair_column, path, number, False) if text_pair_column else None
            label = _label(row.get(label_column), regression, path, number) if label_column else None
            if label_required and label is None:
                raise _error(path, number, f"no {label_column!r} value (a training example needs its label)")
        except DataError as error:
            bad.handle(error)
            continue
        examples.append(TextExample(text, pair, label))
    return examples


def _check_columns(path: str | Path, row: dict[str, Any], text_column: str, label_column: str | None) -> None:
    for column, flag in ((text_column, "--text-column"), (label_column, "--label-column")):
        if column is not None and column not in row:
            raise _error(path, 1, f"no {column!r} column; the columns are {list(row)} (name yours with {flag})")


# -- CoNLL ---------------------------------------------------------------------------------------


def read_conll(path: str | Path, iob1: bool | None = None, bad_rows: BadRows | None = None) -> list[NERExample]:
    """Sentences of a CoNLL column file: one token per line, the token in the first column and
    the NER tag in the last (CoNLL-2003 `token POS chunk NER`, WNUT-17 `token<TAB>tag`).

    Blank (or whitespace-only) lines end sentences; `-DOCSTART-` lines separate documents and end
    any sentence they follow. Columns are split on tabs if the file's first token line has one,
    else on whitespace; every token line must have as many columns as that first one.

    Tags come back as IOB2. `iob1=True` converts from IOB1 (I- starts entities, B- only between
    two adjacent entities of one type); `iob1=False` requires valid IOB2 (an I- that starts an
    entity is an error); `iob1=None` (auto) converts, which leaves valid IOB2 unchanged.
    A sentence with a bad line is one bad row (skipped whole with `BadRows("skip")`).
    """
    bad = bad_rows if bad_rows is not None else BadRows()
    sentences: list[NERExample] = []
    tokens: list[str] = []
    tags: list[str] = []
    lines: list[int] = []
    broken: list[DataError] = []  # the current sentence's first bad line
    delimiter: str | None = None
    n_columns = 0

    def end_sentence() -> None:
        if iob1 is False and tokens and not broken:
            wrong = starts_chunk_with_inside(tags)
            if wrong:
                broken.append(_error(path, lines[wrong[0]], f"{tags[wrong[0]]!r} starts an entity: not IOB2 (IOB1?)"))
        if broken:
            bad.handle(broken[0])
        elif tokens:
            fixed = iob1_to_iob2(tags) if iob1 is not False else list(tags)
            sentences.append(NERExample(list(tokens), fixed, lines[0]))
        tokens.clear()
        tags.clear()
        lines.clear()
        broken.clear()

    def problem(line: str, columns: list[str]) -> str | None:
        nonlocal n_columns
        if reason := undecodable(line):
            return reason
        if n_columns == 0:
            if len(columns) < 2:
                return f"expected a token and a tag, got {line!r}"
            n_columns = len(columns)
        elif len(columns) != n_columns:
            return f"{len(columns)} columns, expected {n_columns} as on the first line"
        prefix, entity_type = split_tag(columns[-1])
        if columns[-1] != "O" and not (prefix in ("B", "I") and entity_type):
            return f"tag {columns[-1]!r} is not O, B-TYPE or I-TYPE"
        return None

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
            if reason := problem(line, columns):
                if not broken:
                    broken.append(_error(path, number, reason))
                continue
            tokens.append(columns[0])
            tags.append(columns[-1])
            lines.append(number)
        end_sentence()
    if not sentences and not bad.found:
        raise DataError(path, 0, "no sentences found (an empty file?)")
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
