"""A task's decoded results as output rows: the fields its HTTP route returns, and their Parquet schema.

Where the route answers an input with one object (a label, an answer, a sentence vector) its fields become
the row's columns. Where it answers with a list (ranked labels, entities, ranked answers, fill-mask
candidates, ranked choices) the list is one column of structs with the route's fields, and the input's
`truncated` / `truncated_tokens` are repeated as columns of the row. Two shapes differ from the JSON body,
because a column has one type: fill-mask's `candidates` is always a list per [MASK] (the route returns the
bare list when the text has one [MASK]), and a multiple-choice row's `truncated_tokens` is the sum over its
choices. Embeddings are float32 (the model's own precision); scores are float64, as in the JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.classification import REGRESSION, SINGLE_LABEL, resolve_problem_type

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Layout:
    """How one result becomes row fields, and the Arrow fields of those columns (after id and row)."""

    fields: list[Any]  # pyarrow fields
    to_row: Callable[[Any], Row]


def _truncation(result: dict[str, Any]) -> Row:
    return {"truncated": bool(result.get("truncated", False)), "truncated_tokens": int(result.get("truncated_tokens", 0))}


def layout(task: str, spec: Any, options: Any) -> Layout:
    import pyarrow as pa

    truncation = [pa.field("truncated", pa.bool_()), pa.field("truncated_tokens", pa.int64())]
    trunc_struct = [("truncated", pa.bool_()), ("truncated_tokens", pa.int64())]
    if task in ("classification", "pair"):
        kind = resolve_problem_type(spec.problem_type, max(1, len(spec.labels)))
        if kind == REGRESSION or (kind == SINGLE_LABEL and options.top_k is None):
            return Layout([pa.field("label", pa.string()), pa.field("score", pa.float64()), *truncation],
                          lambda r: {"label": r.get("label"), "score": r["score"], **_truncation(r)})
        label = pa.struct([("label", pa.string()), ("score", pa.float64()), *trunc_struct])
        return Layout([pa.field("labels", pa.list_(label)), *truncation],
                      lambda r: {"labels": r, **_truncation(r[0] if r else {})})
    if task == "ner":
        entity = pa.struct([("entity", pa.string()), ("text", pa.string()), ("start", pa.int64()),
                            ("end", pa.int64()), ("score", pa.float64())])
        return Layout([pa.field("entities", pa.list_(entity))], lambda r: {"entities": r})
    if task == "qa":
        answer = [("answer", pa.string()), ("start", pa.int64()), ("end", pa.int64()), ("score", pa.float64()),
                  ("is_impossible", pa.bool_())]
        if options.top_k == 1:
            return Layout([pa.field(name, kind) for name, kind in answer], dict)
        return Layout([pa.field("answers", pa.list_(pa.struct(answer)))], lambda r: {"answers": r})
    if task == "embedding":
        vector = pa.list_(pa.float32())
        if options.output == "tokens":
            token = pa.struct([("token", pa.string()), ("start", pa.int64()), ("end", pa.int64()),
                               ("embedding", vector)])
            return Layout([pa.field("tokens", pa.list_(token)), *truncation],
                          lambda r: {"tokens": r["tokens"], **_truncation(r)})
        return Layout([pa.field("embedding", vector), *truncation],
                      lambda r: {"embedding": r["embedding"], **_truncation(r)})
    if task == "fill-mask":
        candidate = pa.struct([("score", pa.float64()), ("token", pa.int64()), ("token_str", pa.string()),
                               ("sequence", pa.string())])
        return Layout([pa.field("candidates", pa.list_(pa.list_(candidate)))],
                      lambda r: {"candidates": r if r and isinstance(r[0], list) else [r]})
    if task == "multiple-choice":
        choice = pa.struct([("index", pa.int64()), ("choice", pa.string()), ("score", pa.float64()), *trunc_struct])
        return Layout([pa.field("choices", pa.list_(choice)), *truncation],
                      lambda r: {"choices": r, "truncated": any(c["truncated"] for c in r),
                                 "truncated_tokens": sum(c["truncated_tokens"] for c in r)})
    if task == "rerank":
        ranked = [("index", pa.int64()), ("relevance_score", pa.float64()), ("truncated", pa.bool_())]
        if options.return_documents:
            ranked.append(("document", pa.struct([("text", pa.string())])))
        return Layout([pa.field("results", pa.list_(pa.struct(ranked)))], lambda r: {"results": r})
    raise ValueError(f"berth predict does not know how to write {task} results")


def schema(id_type: Any, result_layout: Layout) -> Any:
    """The output schema: the id (the input's id column as text, or the row number), the row number, the fields."""
    import pyarrow as pa

    return pa.schema([pa.field("id", id_type), pa.field("row", pa.int64()), *result_layout.fields])
