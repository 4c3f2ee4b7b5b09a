"""Streaming readers (JSON lines, CSV/TSV, Parquet) and the output part writers (Parquet, JSON lines).

A reader never holds the whole file: JSON lines and CSV/TSV are read line by line, Parquet batch by batch
(`iter_batches`, only the columns asked for). Each yields `(row number, row)`: row numbers count data rows
from 0 (a CSV/TSV header and blank lines are not rows); a row that cannot be read (a line that is not a
JSON object) is yielded as a `BadRow` with its reason, so the run can report it and go on.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

INPUT_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv",
                 ".parquet": "parquet", ".pq": "parquet"}
OUTPUT_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}


@dataclass(frozen=True, slots=True)
class BadRow:
    """A row that could not be read at all."""

    reason: str


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

    def rows(self, skip: int = 0) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
        raise NotImplementedError

    def fraction(self, rows_done: int) -> float:
        if self.total_rows:
            return min(1.0, rows_done / self.total_rows)
        return min(1.0, self.position / self.size)


class JsonLinesReader(Reader):
    def rows(self, skip: int = 0) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
        number = 0
        with open(self.path, "rb") as f:
            for line in f:
                self.position += len(line)
                if not line.strip():
                    continue
                if number >= skip:  # rows already done are counted, never parsed
                    try:
                        value = orjson.loads(line)
                    except orjson.JSONDecodeError as error:
                        value = BadRow(f"not valid JSON: {error}")
                    if not isinstance(value, dict | BadRow):
                        value = BadRow(f"not a JSON object but a {type(value).__name__}")
                    yield number, value
                number += 1


class TableReader(Reader):
    """CSV (RFC 4180 quoting, fields may span lines) or TSV (split on tabs, no quoting: the GLUE convention),
    with a header line naming the columns."""

    def __init__(self, path: Path, columns: Sequence[str], delimiter: str):
        super().__init__(path, columns)
        self.delimiter = delimiter

    def _lines(self, f: io.BufferedReader) -> Iterator[str]:
        for line in f:
            self.position += len(line)
            yield line.decode("utf-8-sig" if self.position == len(line) else "utf-8")

    def rows(self, skip: int = 0) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
        with open(self.path, "rb") as f:
            lines = self._lines(f)
            if self.delimiter == ",":
                records: Iterator[list[str]] = csv.reader(lines)
            else:
                records = (line.rstrip("\r\n").split("\t") for line in lines)
            header = None
            number = 0
            for record in records:
                if not record or record == [""]:
                    continue
                if header is None:
                    header = record
                    continue
                if number >= skip:
                    yield number, dict(zip(header, record))  # a short row lacks its last columns
                number += 1


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

    def rows(self, skip: int = 0) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
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


def has_column(reader: Reader, column: str) -> bool:
    """Does the file have this column at all (Parquet: its schema; CSV/TSV: its header; JSON lines: the first
    row)? A job without its id column numbers the rows instead."""
    if isinstance(reader, ParquetReader):
        return column in reader.read_columns
    rows = reader.rows()
    try:
        first = next(rows, None)
    finally:
        rows.close()
        reader.position = 0
    return first is not None and isinstance(first[1], dict) and column in first[1]


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


def write_part(path: Path, kind: str, rows: Sequence[dict[str, Any]], schema: Any) -> None:
    """One part file, complete or not there (written beside it, then renamed)."""
    temporary = path.with_name(path.name + ".tmp")
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(list(rows), schema=schema), temporary)
        os.replace(temporary, path)
    else:
        write_atomically(path, json_lines(rows))


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
