"""Streaming readers (JSON lines, CSV/TSV, Parquet) and the output part writers (Parquet, JSON lines).

A reader never holds the whole file: JSON lines and CSV/TSV are read line by line, Parquet batch by batch
(`iter_batches`, only the columns asked for). Each yields `(row number, row)`: row numbers count data rows
from 0 (a CSV/TSV header and blank lines are not rows); a row that cannot be read (a line that is not a
JSON object, bytes that are not UTF-8, a CSV field over `MAX_FIELD_CHARS`) is yielded as a `BadRow` with its
reason and line number, so the run can report it and go on.

Ids keep their type (`id_type`): a Parquet id column keeps its Arrow type; JSON ids that are all integers stay
integers and all strings stay strings; a CSV/TSV id column whose every value is an integer is read as integers,
else as strings. JSON ids that mix types are refused before the run starts.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import orjson

INPUT_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv",
                 ".parquet": "parquet", ".pq": "parquet"}
OUTPUT_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}


# The longest CSV/TSV field read (characters); a longer one makes its row a bad row (the csv module's own
# default limit, 131,072, is below what a long document holds).
MAX_FIELD_CHARS = 16 * 1024 * 1024
_SURROGATE_ESCAPES = re.compile("[\udc80-\udcff]")  # undecodable bytes, as `surrogateescape` keeps them
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_INTEGER = re.compile(r"[+-]?[0-9]+")
INT64_RANGE = (-(2**63), 2**63 - 1)


@dataclass(frozen=True, slots=True)
class BadRow:
    """A row that could not be read at all, and the line of the file where it starts (1-based; 0: unknown)."""

    reason: str
    line: int = field(default=0, compare=False)


def format_of(path: Path, given: str | None, formats: dict[str, str], what: str) -> str:
    if given:
        return given
    suffix = path.suffix.lower()
    if suffix not in formats:
        raise ValueError(f"{what} {path}: cannot tell the format from {suffix or 'no extension'!r}; known: "
                         f"{', '.join(sorted(formats))} (or name it with the format flag)")
    return formats[suffix]


class Reader:
    """Rows of one input file, from row `skip` on; `fraction()` says how much of the file is behind."""

    total_rows: int | None = None  # known up front (Parquet), else None

    def __init__(self, path: Path, columns: Sequence[str]):
        self.path = path
        self.columns = list(columns)  # the columns the job uses (Parquet reads only these)
        self.size = max(1, path.stat().st_size)
        self.position = 0

    def rows(self, skip: int = 0, start: int = 0) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
        """Rows from row `skip` on; `start` > 0 is the byte offset where row `skip` begins (`row_offsets`)."""
        raise NotImplementedError

    def fraction(self, rows_done: int) -> float:
        if self.total_rows:
            return min(1.0, rows_done / self.total_rows)
        return min(1.0, self.position / self.size)


class JsonLinesReader(Reader):
    def rows(self, skip: int = 0, start: int = 0) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
        number = skip if start else 0
        with open(self.path, "rb") as f:
            f.seek(start)
            self.position = start
            line_number = None if start else 0  # unknown after a jump to a byte offset
            for line in f:
                self.position += len(line)
                if line_number is not None:
                    line_number += 1
                if not line.strip():
                    continue
                if number >= skip:  # rows already done are counted, never parsed
                    yield number, json_row(line, line_number or 0)
                number += 1


def json_row(line: bytes, line_number: int) -> dict[str, Any] | BadRow:
    """One JSON line as a row, or a BadRow saying why not."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        value = _lenient_json(line, line_number, error)
    if isinstance(value, BadRow):
        return value
    if not isinstance(value, dict):
        return BadRow(f"not a JSON object but a {type(value).__name__}", line_number)
    return value


def _lenient_json(line: bytes, line_number: int, error: Exception) -> BadRow:
    """Why orjson refused a line: JSON with an unpaired surrogate escape (valid JSON, not text) or not JSON."""
    try:
        value = json.loads(line)
    except ValueError:
        return BadRow(f"not valid JSON: {error}", line_number)
    found = _LONE_SURROGATE.search(json.dumps(value, ensure_ascii=False))
    if found is None:  # what Python reads and JSON does not define (NaN, Infinity)
        return BadRow(f"not valid JSON: {error}", line_number)
    return BadRow(f"valid JSON, but a string holds an unpaired surrogate escape ({ascii(found.group())}): not text "
                  "that UTF-8 (and so the tokenizer) can carry", line_number)


class TableReader(Reader):
    """CSV (RFC 4180 quoting, fields may span lines) or TSV (split on tabs, no quoting: the GLUE convention),
    with a header line naming the columns."""

    def __init__(self, path: Path, columns: Sequence[str], delimiter: str):
        super().__init__(path, columns)
        self.delimiter = delimiter

    def _lines(self, f: io.BufferedReader) -> Iterator[str]:
        for line in f:
            self.position += len(line)
            self.line_number += 1
            # Undecodable bytes are kept as surrogate escapes: their record becomes a bad row, not the end of the run.
            yield line.decode("utf-8-sig" if self.position == len(line) else "utf-8", "surrogateescape")

    def _records(self, lines: Iterator[str]) -> Iterator[list[str] | BadRow]:
        """Records (lists of fields) or BadRows, each with `record_line` set to the line it starts on."""
        if self.delimiter != ",":
            for line in lines:
                self.record_line = self.line_number
                yield _checked(line.rstrip("\r\n").split("\t"), self.record_line)
            return
        csv.field_size_limit(MAX_FIELD_CHARS)
        reader = csv.reader(lines)
        while True:
            self.record_line = self.line_number + 1
            try:
                record = next(reader)
            except StopIteration:
                return
            except csv.Error as error:  # a field over the limit; the reader goes on at the next line
                yield BadRow(f"CSV record not readable: {error} (fields up to {MAX_FIELD_CHARS:,} characters)",
                             self.record_line)
                continue
            yield _checked(record, self.record_line)

    line_number = 0
    record_line = 0

    def header(self) -> list[str] | None:
        self.position = self.line_number = 0
        with open(self.path, "rb") as f:
            record = next((r for r in self._records(self._lines(f)) if r and r != [""]), None)
        self.position = self.line_number = 0
        if isinstance(record, BadRow):
            raise ValueError(f"input {self.path}: the header line cannot be read: {record.reason}")
        return record

    def rows(self, skip: int = 0, start: int = 0) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
        header = self.header() if start else None
        with open(self.path, "rb") as f:
            f.seek(start)
            self.position = start
            self.line_number = 0  # after a jump to a byte offset, lines count from there (reported as unknown)
            records = self._records(self._lines(f))
            number = skip if start else 0
            for record in records:
                if not record or record == [""]:
                    continue
                if header is None:
                    if isinstance(record, BadRow):
                        raise ValueError(f"input {self.path}: the header line cannot be read: {record.reason}")
                    header = record
                    continue
                if number >= skip:
                    if isinstance(record, BadRow):
                        yield number, BadRow(record.reason, 0 if start else record.line)
                    else:
                        yield number, dict(zip(header, record))  # a short row lacks its last columns
                number += 1


def _checked(record: list[str], line: int) -> list[str] | BadRow:
    for cell in record:
        if found := _SURROGATE_ESCAPES.search(cell):
            byte = ord(found.group()) - 0xDC00
            return BadRow(f"not valid UTF-8 (byte 0x{byte:02x})", line)
    return record


class ParquetReader(Reader):
    """Record batches of the columns the job uses; a resumed run starts at the row group holding row `skip`."""

    def __init__(self, path: Path, columns: Sequence[str], batch_rows: int = 1024):
        import pyarrow.parquet as pq

        super().__init__(path, columns)
        self.file = pq.ParquetFile(path)
        self.total_rows = self.file.metadata.num_rows
        present = set(self.file.schema_arrow.names)
        self.read_columns = [c for c in dict.fromkeys(self.columns) if c in present]
        self.batch_rows = batch_rows

    def rows(self, skip: int = 0, start: int = 0) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
        metadata = self.file.metadata
        first_group, number = 0, 0
        while first_group < metadata.num_row_groups and number + metadata.row_group(first_group).num_rows <= skip:
            number += metadata.row_group(first_group).num_rows
            first_group += 1
        groups = list(range(first_group, metadata.num_row_groups))
        if not groups:
            return
        for batch in self.file.iter_batches(self.batch_rows, row_groups=groups, columns=self.read_columns):
            for row in batch.to_pylist():
                if number >= skip:
                    yield number, row
                number += 1


def open_reader(path: Path, kind: str, columns: Sequence[str]) -> Reader:
    if kind == "jsonl":
        return JsonLinesReader(path, columns)
    if kind in ("csv", "tsv"):
        return TableReader(path, columns, "," if kind == "csv" else "\t")
    if kind == "parquet":
        return ParquetReader(path, columns)
    raise ValueError(f"unknown input format {kind!r}")


def row_offsets(reader: Reader, every: int, skip: int = 0) -> list[tuple[int, int]]:
    """(row number, byte offset) where each run of `every` rows from row `skip` begins, for `rows(number,
    offset)`: one pass over the file. Offset 0 means "from the top, skipping rows" (and always for Parquet,
    which finds its row group by number)."""
    if isinstance(reader, ParquetReader):
        return [(number, 0) for number in range(skip, reader.total_rows or 0, every)]
    offsets: list[tuple[int, int]] = []
    end_of_previous = 0
    for number, _ in reader.rows(skip):
        if (number - skip) % every == 0:
            offsets.append((number, end_of_previous if number > skip else 0))
        end_of_previous = reader.position
    reader.position = 0
    return offsets


def id_type(reader: Reader, column: str) -> str:
    """The id column's type for the output: "int64" or "string" (or, for Parquet, the column's own Arrow type
    as text). One pass over the column (CSV/TSV, JSON lines); raises ValueError for JSON ids of mixed types."""
    if isinstance(reader, ParquetReader):
        return str(reader.file.schema_arrow.field(column).type)
    kinds: dict[str, int] = {}  # kind -> first row number with it
    try:
        for number, row in reader.rows():
            value = row.get(column) if isinstance(row, dict) else None
            if value is None or (isinstance(reader, TableReader) and value == ""):
                continue
            kinds.setdefault(_id_kind(value, isinstance(reader, TableReader)), number)
            if isinstance(reader, TableReader) and "string" in kinds:
                break  # a table's column is text from its first non-integer on
    finally:
        reader.position = 0
    if isinstance(reader, TableReader):
        return "string" if "string" in kinds else "int64"
    if len(kinds) > 1:
        seen = ", ".join(f"{kind} (first at row {number})"
                         for kind, number in sorted(kinds.items(), key=lambda item: item[1]))
        raise ValueError(f"input {reader.path}: the id column {column!r} mixes types: {seen}; give every row an id "
                         "of one type (all integers or all strings)")
    kind = next(iter(kinds), "string")
    if kind not in ("int64", "string"):
        raise ValueError(f"input {reader.path}: the id column {column!r} holds {kind} values; ids must be integers "
                         "or strings")
    return kind


def _id_kind(value: Any, table: bool) -> str:
    if table:
        return "int64" if _INTEGER.fullmatch(value) and INT64_RANGE[0] <= int(value) <= INT64_RANGE[1] else "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "int64" if INT64_RANGE[0] <= value <= INT64_RANGE[1] else "integer beyond 64 bits"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


COLUMN_SAMPLE_ROWS = 1000  # JSON lines have no header: the fields of this many first rows stand for the file's


def _first_rows(reader: Reader, count: int) -> list[dict[str, Any]]:
    """The readable rows among the first `count` (the reader is rewound after)."""
    rows = reader.rows()
    try:
        return [row for _, row in islice(rows, count) if isinstance(row, dict)]
    finally:
        rows.close()
        reader.position = 0


def column_names(reader: Reader) -> list[str]:
    """The file's columns: Parquet's schema, a CSV/TSV header, or the fields of the first JSON lines."""
    if isinstance(reader, ParquetReader):
        return list(reader.file.schema_arrow.names)
    if isinstance(reader, TableReader):
        return reader.header() or []
    return list({name: None for row in _first_rows(reader, COLUMN_SAMPLE_ROWS) for name in row})


def has_column(reader: Reader, column: str) -> bool:
    """Does the file have this column at all (Parquet: its schema; CSV/TSV: its header; JSON lines: the first
    row)? A job without its id column numbers the rows instead."""
    if isinstance(reader, ParquetReader):
        return column in reader.read_columns
    first = _first_rows(reader, 1)
    return bool(first) and column in first[0]


# -- output -------------------------------------------------------------------------------------------


def write_atomically(path: Path, data: bytes) -> None:
    """`path` holds either its old bytes or all of `data`, never a part: a temporary file, then os.replace."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def json_lines(rows: Sequence[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for row in rows)


def encode_part(kind: str, rows: Sequence[dict[str, Any]], schema: Any) -> bytes:
    """The bytes of one part file: a Parquet file of `rows` with `schema`, or their JSON lines."""
    if kind != "parquet":
        return json_lines(rows)
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(list(rows), schema=schema), sink)
    return sink.getvalue().to_pybytes()


def concatenate(parts: Sequence[Path], kind: str, schema: Any, out: Path) -> None:
    """The parts, in order, as one file `out` (written beside it, then renamed): one part in memory at a time."""
    temporary = out.with_name(out.name + ".tmp")
    if kind == "parquet":
        import pyarrow.parquet as pq

        with pq.ParquetWriter(temporary, schema) as writer:
            for part in parts:
                writer.write_table(pq.read_table(part, schema=schema))
    else:
        concatenate_bytes(parts, temporary)
    os.replace(temporary, out)


def concatenate_bytes(parts: Sequence[Path], out: Path) -> None:
    with open(out, "wb") as target:
        for part in parts:
            with open(part, "rb") as source:
                shutil.copyfileobj(source, target)
