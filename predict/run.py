"""The `berth predict` job: a bundle over an input file, a window of rows at a time, resumable.

Per window (`window` rows, 4,096 by default): each row becomes the task's input (the columns the flags
name), and the bundle's engine (tasks/engine.py, the steps the HTTP route runs) answers them: the inputs are
prepared (one `encode_batch` per chunk where the task encodes whole texts), their items planned into batches
(sorted by length over the whole window, padded to the longest item rounded up to 8, at most `pass_tokens`
padded tokens a pass: the service's CPU policy) and run on its lanes, each item keeping what the task's `keep`
asks for, and decoded. What is this module's own: rows and columns, refused rows, windows, parts and resume.
Reading and preparing the next window runs in a thread while the current one's forward passes run (Rust
tokenization and ONNX Runtime both release the GIL).

A row is the task's input as its route takes it: a text (the text column), or an object whose fields are read
from the columns of the same names (`--pair-column` names text_pair's; a list field's cell holds a list, or
in CSV/TSV a JSON list). A row the task refuses (a missing or empty column, too long when not truncating, no
[MASK], a question longer than the model reads...: what `prepare_many`, `input_refusal` and `prepared_refusal`
refuse) is written to the errors file with its reason, never stops the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from predict import io, results
from predict.parts import PartStore
from tasks.common import InputFailed
from tasks.definition import Prepared
from tasks.engine import Engine
from tasks.registry import definition

PREPARE_CHUNK = 256  # inputs prepared by one prepare_many call: a refused input costs at most a chunk's redo


class RowError(ValueError):
    """A row the job cannot give the task (the reason goes to the errors file)."""


@dataclass
class Columns:
    text: str = "text"
    pair: str = "text_pair"
    question: str = "question"
    context: str = "context"
    choices: str = "choices"
    query: str = "query"
    documents: str = "documents"
    id: str = "id"

    def of(self, field: str) -> str:
        """The column of an input object's field."""
        return getattr(self, FIELD_COLUMNS.get(field, field))


FIELD_COLUMNS = {"text_pair": "pair"}  # an input field whose column flag has another name (--pair-column)


@dataclass
class Job:
    bundle: Path
    input: Path
    output: Path
    options: dict[str, Any] = field(default_factory=dict)  # the task's request options that were given
    columns: Columns = field(default_factory=Columns)
    input_format: str | None = None
    output_format: str | None = None
    window: int = 4096
    threads: int = 0  # ONNX Runtime intra-op threads; 0: the usable cores
    lanes: int = 0  # passes side by side, each on threads // lanes threads; 0: one a thread on the CPU
    max_batch_size: int = 64
    pass_tokens: int = 1024
    restart: bool = False
    keep_parts: bool = False
    progress: bool = True
    id_column_given: bool = False  # the id column was named: a file without it is refused, not numbered


@dataclass
class Window:
    first_row: int
    rows: int
    good: list[tuple[int, Any, Prepared]]  # (row number, id, prepared)
    errors: list[dict[str, Any]]


class Predictor:
    """A model with a task's options: rows -> prepared inputs (and refused rows) -> result rows."""

    def __init__(self, model: Engine, options: Any, columns: Columns, id_from_column: bool,
                 max_batch_size: int = 64, pass_tokens: int = 1024, id_type: str = "string",
                 table_input: bool = False):
        self.model = model
        self.id_type = id_type  # io.id_type's answer
        self.table_input = table_input  # CSV/TSV: every cell is text, an integer id column is converted
        self.definition = model.definition
        self.options = options
        self.columns = columns
        self.id_from_column = id_from_column
        self.keep = model.keep(options)
        self.shape = model.shape(self.keep.names, max_batch_size, pass_tokens)
        self.layout = results.layout(self.definition, model.spec, options)

    # -- rows -> inputs ----------------------------------------------------------------------------------

    def _text(self, row: dict[str, Any], column: str) -> str:
        value = row.get(column)
        if value is None:
            raise RowError(f"missing column {column!r}")
        if not isinstance(value, str):
            raise RowError(f"column {column!r}: not text but {type(value).__name__}")
        if not value.strip():
            raise RowError(f"column {column!r}: empty or only whitespace")
        return value

    def _texts(self, row: dict[str, Any], column: str) -> list[str]:
        """A list of texts: a list value, or in CSV/TSV a JSON list in the cell."""
        values = row.get(column)
        if isinstance(values, str):
            import orjson

            try:
                values = orjson.loads(values)
            except orjson.JSONDecodeError:
                raise RowError(f"column {column!r}: not a JSON list of texts") from None
        if not isinstance(values, list):
            raise RowError(f"missing column {column!r}" if values is None
                           else f"column {column!r}: not a list of texts")
        texts = {f"{column}[{i}]": value for i, value in enumerate(values)}
        return [self._text(texts, name) for name in texts]

    def make_input(self, row: dict[str, Any]) -> Any:
        """The task's input from a row, as the route takes it (a text, or an object with the route's fields)."""
        d, c = self.definition, self.columns
        if not d.input_fields:
            return self._text(row, c.text)
        raw = SimpleNamespace(**{name: self._texts(row, c.of(name)) if name in d.list_fields else
                                 self._text(row, c.of(name)) for name in d.input_fields})
        if refused := d.input_refusal(raw):
            field, why = refused
            raise RowError(f"column {c.of(field)!r}: {why}")
        return raw

    def row_id(self, number: int, row: Any) -> Any:
        """The row's id as the output holds it: the input's own value and type (a CSV/TSV column of integers as
        integers, an empty cell as null), or the row number without an id column."""
        if not self.id_from_column:
            return number
        value = row.get(self.columns.id) if isinstance(row, dict) else None
        if isinstance(value, str) and self.id_type in ("int64", "string") and self.table_input:
            return (int(value) if value else None) if self.id_type == "int64" else value
        return value

    # -- inputs -> prepared ----------------------------------------------------------------------------

    def _prepare_one(self, raw: Any) -> Prepared | Exception:
        try:
            return self.definition.prepare(self.model.tokenizer, self.model.spec, raw, self.options)
        except Exception as error:  # noqa: BLE001 - one row's failure is that row's error, never the run's
            return error

    def _prepare(self, inputs: list[Any]) -> list[Prepared | Exception]:
        """Each input prepared, or the error that refused it: a refused input is set aside and the rest
        prepared again (those before it, which passed, and those after it)."""
        done: list[Prepared | Exception] = []
        while inputs:
            try:
                done += self.model.prepare(inputs, self.options)
                break
            except InputFailed as failed:
                if failed.index:
                    done += self.model.prepare(inputs[: failed.index], self.options)
                done.append(failed.error)
                inputs = inputs[failed.index + 1:]
            except Exception:  # noqa: BLE001 - not a task refusal: find the row one by one
                done += [self._prepare_one(raw) for raw in inputs]
                break
        return done

    def check(self, prepared: Prepared) -> None:
        """What the task refuses once the input is tokenized."""
        if refused := self.definition.prepared_refusal(self.model.spec, prepared):
            field, why = refused
            raise RowError(f"column {self.columns.of(field)!r}: {why}")

    def prepare_window(self, chunk: list[tuple[int, Any]]) -> Window:
        errors: list[dict[str, Any]] = []
        accepted: list[tuple[int, Any, Any]] = []
        for number, row in chunk:
            ident = self.row_id(number, row)
            if isinstance(row, io.BadRow):
                errors.append({"id": ident, "row": number, **({"line": row.line} if row.line else {}),
                               "reason": row.reason})
                continue
            try:
                accepted.append((number, ident, self.make_input(row)))
            except RowError as error:
                errors.append({"id": ident, "row": number, "reason": str(error)})
        prepared: list[Prepared | Exception] = []
        for start in range(0, len(accepted), PREPARE_CHUNK):
            prepared += self._prepare([raw for _, _, raw in accepted[start : start + PREPARE_CHUNK]])
        good = []
        for (number, ident, _), p in zip(accepted, prepared):
            if isinstance(p, Prepared):
                try:
                    self.check(p)
                    good.append((number, ident, p))
                    continue
                except RowError as error:
                    p = error
            reason = str(p) if isinstance(p, ValueError) else f"{type(p).__name__}: {p}"
            errors.append({"id": ident, "row": number, "reason": reason})
        errors.sort(key=lambda e: e["row"])
        return Window(chunk[0][0], len(chunk), good, errors)

    # -- prepared -> results ---------------------------------------------------------------------------

    def results(self, prepared: list[Prepared]) -> list[Any]:
        """The decoded results of prepared inputs: the engine runs every item in planned batches (on its lanes),
        each keeping what the task's Keep makes of its rows, then the task's decode."""
        return self.model.answer(prepared, self.options, self.keep, self.shape)

    def output_rows(self, window: Window) -> list[dict[str, Any]]:
        decoded = self.results([p for _, _, p in window.good]) if window.good else []
        return [{"id": ident, "row": number, **self.layout.to_row(result)}
                for (number, ident, _), result in zip(window.good, decoded)]


class Progress:
    """Rows written, through the shared reporter (tasks/runtime/progress.py): a bar on a terminal, else a line at least
    every 30 s on stderr; the total is estimated from the share of the input read so far."""

    def __init__(self, fraction: Callable[[int], float], rows_before: int, enabled: bool):
        from tasks.runtime.progress import Progress as Reporter

        self.fraction = fraction  # rows done -> how much of the input is behind
        self.reporter = Reporter("berth predict", unit="rows", initial=rows_before, enabled=enabled)

    def update(self, rows_done: int, final: bool = False) -> None:
        reporter = self.reporter
        if reporter.disable:
            return
        fraction = 1.0 if final else self.fraction(rows_done)
        if 0 < fraction <= 1:
            reporter.total = rows_done if final else round(rows_done / fraction)
        reporter.update(rows_done - reporter.position)
        if final:
            reporter.close()


def task_options(definition: Any, given: dict[str, Any]) -> Any:
    """The task's request options from the flags given; a flag the task does not take is an error naming it."""
    fields = definition.options.model_fields
    unknown = [name for name in given if name not in fields]
    if unknown:
        flags = ", ".join("--" + name.replace("_", "-") for name in unknown)
        takes = ", ".join("--" + name.replace("_", "-") for name in fields) or "no options"
        raise ValueError(f"the {definition.name} task takes no {flags} (it takes {takes})")
    return definition.options(**given)


@dataclass
class Setup:
    """What a job decides before its first row: formats, the reader, the output schema and the part store."""

    in_kind: str
    out_kind: str
    reader: io.Reader
    id_from_column: bool
    id_type: str  # "int64", "string" or a Parquet column's Arrow type
    schema: Any
    store: PartStore


def setup(job: Job, bundle: Any, options: Any) -> Setup:
    """The job's reader, schema and part store (with the job's fingerprint) for a verified bundle."""
    import pyarrow as pa

    in_kind = io.format_of(job.input, job.input_format, io.INPUT_FORMATS, "input")
    out_kind = io.format_of(job.output, job.output_format, io.OUTPUT_FORMATS, "output")
    refuse_overwriting_input(job)
    c = job.columns
    reader = io.open_reader(job.input, in_kind,
                            [c.text, c.pair, c.question, c.context, c.choices, c.query, c.documents, c.id])
    refuse_missing_columns(job, reader, definition(bundle.spec().task))
    id_from_column = io.has_column(reader, c.id)
    id_type = io.id_type(reader, c.id) if id_from_column else "int64"
    spec = bundle.spec()
    layout = results.layout(definition(spec.task), spec, options)
    arrow_id = reader.file.schema_arrow.field(c.id).type if id_type not in ("int64", "string") else \
        pa.int64() if id_type == "int64" else pa.string()
    schema = results.schema(arrow_id, layout)
    stat = job.input.stat()
    fingerprint = {"bundle": bundle.manifest_sha256 or str(job.bundle.resolve()),
                   "input": str(job.input.resolve()), "input_bytes": stat.st_size, "input_mtime_ns": stat.st_mtime_ns,
                   "input_format": in_kind, "columns": asdict(c), "id_from_column": id_from_column, "id_type": id_type,
                   "options": options.model_dump(mode="json"), "window": job.window, "format": out_kind}
    store = PartStore(job.output, out_kind, fingerprint)
    return Setup(in_kind, out_kind, reader, id_from_column, id_type, schema, store)


def refuse_missing_columns(job: Job, reader: io.Reader, task: Any) -> None:
    """Raise ValueError before the first pass when the file lacks a column every row needs (the text, or each
    field of the task's input object), or the id column the job was told to read: every row would fail."""
    found = io.column_names(reader)
    if not found:
        return  # an empty file: nothing to run
    c = job.columns
    needed = [c.of(name) for name in task.input_fields] if task.input_fields else [c.text]
    if job.id_column_given:
        needed.append(c.id)
    missing = [column for column in needed if column not in found]
    if missing:
        flags = ", ".join(f"--{column_field(c, m)}-column" for m in missing)
        raise ValueError(f"input {job.input}: no {' or '.join(repr(m) for m in missing)} column; its columns are "
                         f"{found} (name the right one with {flags})")


def column_field(columns: Columns, column: str) -> str:
    """The Columns field that names `column` (text, pair, id ...)."""
    return next(name for name, value in asdict(columns).items() if value == column)


def refuse_overwriting_input(job: Job) -> None:
    """Raise ValueError when the output, its errors file or its parts folder is (or resolves to) the input."""
    source = job.input.resolve()
    for target in (job.output, errors_path(job), job.output.with_name(job.output.name + ".parts")):
        if target.resolve() == source or (target.exists() and source.exists() and os.path.samefile(target, source)):
            raise ValueError(f"--out {job.output}: {target} is the input file {job.input}; refusing to write over "
                             "the input (name another output)")


def summary(job: Job, store: PartStore, resumed: list[Any], rows_done: int, started: float) -> dict[str, Any]:
    seconds = time.monotonic() - started
    return {"output": str(job.output), "errors_file": str(errors_path(job)), "rows": rows_done,
            "written": sum(p.written for p in store.parts), "errors": sum(p.errors for p in store.parts),
            "resumed_parts": len(resumed), "seconds": round(seconds, 3),
            "rows_per_second": round((rows_done - sum(p.rows for p in resumed)) / max(seconds, 1e-9), 1)}


def errors_path(job: Job) -> Path:
    return job.output.with_name(job.output.name + ".errors.jsonl")


def predict(job: Job) -> dict[str, Any]:
    """Run the job to the end (resuming the finished parts of an earlier run of it); the summary."""
    started = time.monotonic()
    model = Engine.load(job.bundle, threads=job.threads, lanes=job.lanes)
    options = task_options(model.definition, job.options)
    plan = setup(job, model.bundle, options)
    reader, store = plan.reader, plan.store
    predictor = Predictor(model, options, job.columns, plan.id_from_column, job.max_batch_size,
                          job.pass_tokens, plan.id_type, plan.in_kind in ("csv", "tsv"))
    resumed = store.open(job.restart)
    rows_done = store.next_row
    progress = Progress(reader.fraction, rows_done, job.progress)
    rows = reader.rows(skip=rows_done)

    def next_window() -> Window | None:
        chunk = list(islice(rows, job.window))
        return predictor.prepare_window(chunk) if chunk else None

    try:
        with ThreadPoolExecutor(1, thread_name_prefix="berth-predict-prepare") as pool:
            pending = pool.submit(next_window)
            while (window := pending.result()) is not None:
                pending = pool.submit(next_window)  # the next window is read and tokenized while this one runs
                output = predictor.output_rows(window)
                store.add(window.first_row, window.rows, output, window.errors, plan.schema)
                rows_done = window.first_row + window.rows
                progress.update(rows_done)
    finally:
        model.close()
    progress.update(rows_done, final=True)
    store.finish(job.output, errors_path(job), plan.schema, job.keep_parts)
    return {**summary(job, store, resumed, rows_done, started), "task": model.definition.name,
            "provider": model.provider, "threads": model.threads, "lanes": model.lanes}
