"""A task's decoded results as output rows, and their Parquet schema.

What a result is as row columns is the task's own: its definition's `row_layout` (tasks/definition.py) gives the
columns, their types as data (scalars, lists, structs), and how a result becomes a row's fields. Here those
types become Arrow types, after the two columns every row has: the id (the input's id column as text, or the row
number) and the row number.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.definition import Column, ListOf, StructOf, TaskDefinition

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Layout:
    """How one result becomes row fields, and the Arrow fields of those columns (after id and row)."""

    fields: list[Any]  # pyarrow fields
    to_row: Callable[[Any], Row]


def arrow_type(kind: Any) -> Any:
    """The Arrow type of a column type of the task layer: a scalar's name, a ListOf or a StructOf."""
    import pyarrow as pa

    if isinstance(kind, ListOf):
        return pa.list_(arrow_type(kind.item))
    if isinstance(kind, StructOf):
        return pa.struct([arrow_field(column) for column in kind.columns])
    scalars = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "float32": pa.float32(),
               "bool": pa.bool_()}
    if kind not in scalars:
        raise ValueError(f"no Arrow type for the column type {kind!r}")
    return scalars[kind]


def arrow_field(column: Column) -> Any:
    import pyarrow as pa

    return pa.field(column.name, arrow_type(column.type))


def layout(definition: TaskDefinition, spec: Any, options: Any) -> Layout:
    """The output columns of `definition`'s results with these options (ValueError: a task predict cannot write)."""
    rows = definition.row_layout(spec, options)
    return Layout([arrow_field(column) for column in rows.columns], rows.to_row)


def schema(id_type: Any, result_layout: Layout) -> Any:
    """The output schema: the id (the input's id column as text, or the row number), the row number, the fields."""
    import pyarrow as pa

    return pa.schema([pa.field("id", id_type), pa.field("row", pa.int64()), *result_layout.fields])
