"""What a task's result is as output columns comes from its definition (`row_layout`, types as data in the task
layer) and becomes Arrow types here: every served task can be written, with the shapes the JSON answer has."""

from __future__ import annotations

import pyarrow as pa
import pytest

from predict import results
from tasks.definition import SCALARS, TaskDefinition
from tasks.registry import DEFINITIONS, definition
from tasks.runtime.spec import TaskSpec

TRUNCATION = [pa.field("truncated", pa.bool_()), pa.field("truncated_tokens", pa.int64())]


@pytest.mark.parametrize("task", [name for name, d in DEFINITIONS.items() if d.endpoints])
def test_every_served_task_has_output_columns(task):
    d = definition(task)
    layout = results.layout(d, TaskSpec(task=task, labels=["a", "b"]), d.options())
    schema = results.schema(pa.int64(), layout)
    assert schema.names[:2] == ["id", "row"] and len(set(schema.names)) == len(schema.names) > 2


def test_every_scalar_column_type_has_an_arrow_type():
    assert [results.arrow_type(name) for name in SCALARS] == [pa.string(), pa.int64(), pa.float64(), pa.float32(),
                                                               pa.bool_()]
    with pytest.raises(ValueError, match="no Arrow type"):
        results.arrow_type("decimal")


def test_a_task_without_a_layout_is_refused_by_name():
    class Unwritable(TaskDefinition):
        name = "unwritable"

    with pytest.raises(ValueError, match="does not know how to write unwritable results"):
        results.layout(Unwritable(), TaskSpec(task="ner", labels=["O"]), None)


def test_columns_have_the_json_answers_types():
    def fields(task, spec=None, **options):
        d = definition(task)
        return results.layout(d, spec or TaskSpec(task=task), d.options(**options)).fields

    label = [pa.field("label", pa.string()), pa.field("score", pa.float64())]
    assert fields("classification", TaskSpec(task="classification", labels=["n", "p"])) == label + TRUNCATION
    assert fields("classification", TaskSpec(task="classification", labels=["n", "p"]), top_k=2) == [
        pa.field("labels", pa.list_(pa.struct(label + TRUNCATION))), *TRUNCATION]
    assert fields("pair", TaskSpec(task="pair", problem_type="regression")) == label + TRUNCATION
    answer = [pa.field("answer", pa.string()), pa.field("start", pa.int64()), pa.field("end", pa.int64()),
              pa.field("score", pa.float64()), pa.field("is_impossible", pa.bool_())]
    assert fields("qa") == answer
    assert fields("qa", top_k=3) == [pa.field("answers", pa.list_(pa.struct(answer)))]
    assert fields("embedding") == [pa.field("embedding", pa.list_(pa.float32())), *TRUNCATION]
    candidate = pa.struct([("score", pa.float64()), ("token", pa.int64()), ("token_str", pa.string()),
                           ("sequence", pa.string())])
    assert fields("fill-mask") == [pa.field("candidates", pa.list_(pa.list_(candidate)))]
    ranked = [("index", pa.int64()), ("relevance_score", pa.float64()), ("truncated", pa.bool_())]
    assert fields("rerank") == [pa.field("results", pa.list_(pa.struct(ranked)))]
    assert fields("rerank", return_documents=True) == [pa.field("results", pa.list_(pa.struct(
        [*ranked, ("document", pa.struct([("text", pa.string())]))])))]


def test_rows_take_the_shapes_a_column_has():
    fill = results.layout(definition("fill-mask"), TaskSpec(task="fill-mask"), definition("fill-mask").options())
    one = [{"score": 0.5, "token": 1, "token_str": "a", "sequence": "a"}]
    assert fill.to_row(one) == {"candidates": [one]}  # one [MASK]: the bare list, as a list per [MASK]
    assert fill.to_row([one, one]) == {"candidates": [one, one]}
    d = definition("multiple-choice")
    choices = [{"index": 1, "choice": "x", "score": 0.7, "truncated": True, "truncated_tokens": 2},
               {"index": 0, "choice": "y", "score": 0.3, "truncated": False, "truncated_tokens": 0}]
    row = results.layout(d, TaskSpec(task="multiple-choice"), d.options()).to_row(choices)
    assert row == {"choices": choices, "truncated": True, "truncated_tokens": 2}
