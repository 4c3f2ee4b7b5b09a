"""What a task is, in one object: the ONE place that knows a task (torch-free).

A `TaskDefinition` says which head fine-tunes it and what its ONNX graph outputs, whether those
outputs are per token, which HTTP route serves it and with which request options, how one input
becomes model items (`prepare`: a sequence, or overlapping windows; `prepare_many` for a list, one
`encode_batch` for all its texts where the task encodes whole texts), how the items' outputs become
results (`decode`), what "the same prediction" means for the parity gate (`parity_answer`,
`confidence`), how decoded results are scored against gold (`score`), and which columns a result is in an
output row of `berth predict` (`row_layout`: their types as data, no file format here). The service,
evaluation, fine-tuning and the parity gate all go through it, so what is evaluated is what is served:

    input --prepare--> items --run (any runner)--> per-item outputs --decode--> results --score--> metrics

Each task module (`tasks/ner.py`, `tasks/qa.py`, ...) defines its own and `tasks/registry.py` lists
them: adding a task is one module here plus its head in `training/bert/model.py`.

How a task is served over HTTP is data here too (`Endpoint`: paths, request and response shapes, the inputs'
fields) and hooks that refuse what the task cannot take (`check_options`, `check_input`, `check_prepared`,
raising `tasks.common.Refusal`s, or `TooLarge` for more than the task takes, each saying which option, input or
field and why; the serving caps they check come as numbers, `ServingLimits`): the service builds its routes,
request models and adapters from them and names the place of a refusal in the request, so no task's name means
anything outside the task layer and no HTTP path or status anything inside it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict
from tokenizers import Tokenizer

from tasks.common import InputFailed
from tasks.runtime.inference import ItemRunner, Keep

if TYPE_CHECKING:
    from tasks.runtime.spec import TaskSpec

ItemOutputs = dict[str, np.ndarray]  # one model item's output rows by output name (per token: trimmed to it)


@dataclass(slots=True)
class Prepared:
    """One input's model items and what decoding it needs."""

    items: Sequence[Any]
    state: Any = None
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class InputField:
    """A field of an input object: one text, or a list of texts (`many`)."""

    name: str
    many: bool = False
    description: str | None = None  # shown in the request schema


# How an endpoint's request carries its inputs, and which service adapter runs it:
# - "inputs": `{"model", "inputs": one input or a list, **options}`, answered `{"model", "results"}`;
# - "similarity": as "inputs" with {source, targets} objects, each text embedded and the targets compared with
#   the source (cosines);
# - "openai": OpenAI's embeddings request and response (`input`: texts or token ids);
# - "ranking": a query and its documents (fields `query`, `documents`) at the request's root, answered in
#   Cohere's rerank shape.
ENDPOINT_KINDS = ("inputs", "similarity", "openai", "ranking")


@dataclass(frozen=True, slots=True, eq=False)  # compared (and hashed) by identity: one object per endpoint
class Endpoint:
    """An HTTP route serving a task, as data: the service turns it into the route, its request model (the
    options, a `model` name and the inputs) and its adapter. An input is a text unless `fields` are given."""

    path: str
    name: str  # the operation's name (its OpenAPI operationId starts with it)
    summary: str
    description: str
    request: str  # the request schema's name
    response: str  # the name of the service's response schema the answer is checked against
    kind: str = "inputs"  # one of ENDPOINT_KINDS
    inputs_description: str = "a text or a list of texts"
    input_object: str | None = None  # the schema name of an input object (with `fields`)
    fields: tuple[InputField, ...] = ()
    options: type[BaseModel] | None = None  # the request options; None: the task's own
    examples: tuple[dict[str, Any], ...] = ()
    also_at: tuple[str, ...] = ()  # other paths of the same endpoint
    max_texts: int | None = None  # "similarity", "ranking": the most texts of an input's list (more: 413)

    def describe(self) -> dict[str, Any]:
        """The endpoint for a client (the model listing): its path, kind, input fields and response schema."""
        return {"path": self.path, "kind": self.kind, "response": self.response,
                "fields": [{"name": f.name, "many": f.many} for f in self.fields]}


@dataclass(frozen=True, slots=True)
class ServingLimits:
    """The serving caps a task's hooks check a request against, as numbers (a server fills them from its settings,
    and the refusals name each cap by the setting's name, which is the field's)."""

    max_answer_length_cap: int  # the largest max_answer_length a QA request may ask for, in tokens
    max_masks_per_input: int  # the most [MASK] tokens of one fill-mask input


class NoOptions(BaseModel):
    """Request options of a task that has none (besides its inputs)."""

    model_config = ConfigDict(extra="forbid")


# -- output rows (berth predict): a result as row columns, the columns' types as data --------------------------

# A column's type: a scalar (one of SCALARS), a `ListOf` a type, or a `StructOf` columns (an object: a ranked
# label, an entity, an answer...). berth predict makes its Parquet (Arrow) schema of them; the types are the JSON
# answer's (scores float64, embeddings float32: the model's own precision).
SCALARS = ("string", "int64", "float64", "float32", "bool")


@dataclass(frozen=True, slots=True)
class ListOf:
    """A list of values of one column type."""

    item: Any  # a scalar name, a ListOf or a StructOf


@dataclass(frozen=True, slots=True)
class Column:
    """A named column of an output row (or a named field of a `StructOf`)."""

    name: str
    type: Any  # a scalar name, a ListOf or a StructOf


@dataclass(frozen=True, slots=True)
class StructOf:
    """An object of named columns."""

    columns: tuple[Column, ...]


def columns(*named: tuple[str, Any]) -> tuple[Column, ...]:
    """Columns from (name, type) pairs, in order."""
    return tuple(Column(name, kind) for name, kind in named)


@dataclass(frozen=True, slots=True)
class RowLayout:
    """How one decoded result becomes the fields of an output row (`to_row`), and those columns, in order."""

    columns: tuple[Column, ...]
    to_row: Callable[[Any], dict[str, Any]]


TRUNCATION = columns(("truncated", "bool"), ("truncated_tokens", "int64"))  # how much of an input was cut


def truncation_fields(result: dict[str, Any]) -> dict[str, Any]:
    """A result's `truncated` / `truncated_tokens` as row fields (False / 0 where it has none)."""
    return {"truncated": bool(result.get("truncated", False)),
            "truncated_tokens": int(result.get("truncated_tokens", 0))}


class TaskDefinition:
    name: ClassVar[str]
    head_class: ClassVar[str]  # the model class of training/bert/model.py that fine-tunes it
    output_names: ClassVar[tuple[str, ...]]
    per_token: ClassVar[bool] = False  # outputs (B, T, ...) trimmed per item to its tokens
    token_outputs: ClassVar[tuple[str, ...]] = ()  # outputs with a row per token although per_token is False
    endpoints: ClassVar[tuple[Endpoint, ...]] = ()  # its HTTP routes, its own first; (): not served
    options: ClassVar[type[BaseModel]] = NoOptions  # the request options and their defaults
    answers_can_be_impossible: ClassVar[bool] = False  # a model may answer "no answer" (SQuAD v2.0-trained)
    # a text its tokenizer reads nothing of (only control or format characters) has a true answer: the task's empty
    # one (NER: no entities); else the service refuses it as it refuses an empty text
    answers_unread_text: ClassVar[bool] = False
    pipeline_tasks: ClassVar[tuple[str, ...]] = ()  # what Hugging Face calls what its models do
    input_fields: ClassVar[tuple[str, ...]] = ()  # one input is an object with these fields; () a text
    data_format: ClassVar[str | None] = None  # the data file format `--format auto` means; None: sniffed
    parity_examples: ClassVar[int] = 256  # examples of the parity gate's default dev slice
    metric_examples: ClassVar[int | None] = None  # dev examples of the parity metric gate; None: no metric
    agreement: ClassVar[str] = "same predicted label(s)"  # what parity_answer compares, for the report
    # Fine-tuning (training/): what `berth finetune --task <name>` looks up.
    training_adapter: ClassVar[str | None] = None  # adapter class in training/finetuning/task_data.py, or None
    finetune_max_seq_length: ClassVar[int] = 128  # fine-tuning's default tokens per sequence
    finetune_doc_stride: ClassVar[int | None] = None  # default overlap of windows; None: a quarter of the length
    pools: ClassVar[bool] = False  # its head pools the sequence into one vector (fine-tuning's --pooling applies)
    feature_based_head: ClassVar[str | None] = None  # the head class of the paper's feature-based approach, if any

    @property
    def route(self) -> str | None:
        """The path of the task's own route; None: not served."""
        return self.endpoints[0].path if self.endpoints else None

    @property
    def list_fields(self) -> tuple[str, ...]:
        """The fields of an input object that hold a list of texts (its own route's `many` fields)."""
        return tuple(f.name for f in self.endpoints[0].fields if f.many) if self.endpoints else ()

    def is_token_output(self, name: str) -> bool:
        """Does output `name` have a row per token (padding rows to leave out of comparisons)?"""
        return self.per_token or name in self.token_outputs

    def needs_labels(self, problem_type: str | None) -> bool:
        """Must a bundle of this task list its labels?"""
        return False

    def spec_from_checkpoint(self, folder: Path, config: dict[str, Any], pooling: str | None = None) -> TaskSpec:
        """The spec of a Hugging Face checkpoint folder that has no berth_task.json, read as this task: the labels
        of its config.json where the task has labels. `pooling` is for tasks that pool (embedding)."""
        from tasks.runtime.spec import TaskSpec

        problem_type = config.get("problem_type")
        id2label = config.get("id2label") or {}
        labels = [id2label[str(i)] for i in range(len(id2label))] if self.needs_labels(problem_type) else []
        return TaskSpec(task=self.name, labels=labels, problem_type=problem_type)

    def head_overrides(self, spec: TaskSpec) -> dict[str, Any]:
        """Config values the head class is built with for `spec`: its label names by default."""
        return {"id2label": dict(enumerate(spec.labels))} if spec.labels else {}

    # -- serving: input -> items -> results ------------------------------------------------------------

    def texts(self, raw: Any) -> list[tuple[str, str]]:
        """(field name, text) of one input, for the service's limit checks."""
        if not self.input_fields:
            return [("text", raw)]
        return [(name, getattr(raw, name)) for name in self.input_fields]

    def prepare(self, tokenizer: Tokenizer, spec: TaskSpec, raw: Any, options: Any) -> Prepared:
        """One input's items: `prepare_many` of a list of one. A task overrides this or `prepare_many`."""
        try:
            return self.prepare_many(tokenizer, spec, [raw], options)[0]
        except InputFailed as failed:
            raise failed.error from None

    def prepare_many(self, tokenizer: Tokenizer, spec: TaskSpec, inputs: Sequence[Any], options: Any) -> list[Prepared]:
        """Every input's items, in order: `prepare` of each by default; a task that encodes whole texts
        overrides it to tokenize the list with one `encode_batch`. Raises `InputFailed` naming the first
        input that cannot be prepared (too long, no [MASK]...)."""
        prepared = []
        for index, raw in enumerate(inputs):
            try:
                prepared.append(self.prepare(tokenizer, spec, raw, options))
            except ValueError as error:
                raise InputFailed(index, error) from error
        return prepared

    # -- serving: what the task refuses before any inference (`Refusal`s with the option or input and field) ---

    def check_options(self, options: Any, limits: ServingLimits) -> None:
        """Request options beyond a serving limit; nothing by default."""

    def check_input(self, bundle: Any, raw: Any, options: Any, index: int) -> None:
        """What the task refuses in input `index` before it is tokenized (`bundle`: the served model's
        `tasks.runtime.bundle.Bundle`); nothing by default."""

    def check_prepared(self, spec: TaskSpec, prepared: Sequence[Prepared], options: Any,
                       limits: ServingLimits) -> None:
        """What the task refuses once the inputs are tokenized; nothing by default."""

    # What no model of the task can answer, whatever the serving limits, as (the input's field, why): berth
    # predict writes it to its errors file, naming the field's column.

    def input_refusal(self, raw: Any) -> tuple[str, str] | None:
        """Why one input (as the route takes it) cannot be answered, before it is tokenized; None: it can."""
        return None

    def prepared_refusal(self, spec: TaskSpec, prepared: Prepared) -> tuple[str, str] | None:
        """Why one tokenized input cannot be answered as asked; None: it can."""
        return None

    def keep(self, tokenizer: Tokenizer, spec: TaskSpec, options: Any) -> Keep:
        """What each item keeps of its forward pass for `decode` with these options (the service runs it in the
        pass's worker thread): every output, copied, by default. A task whose outputs are large overrides it to
        ask for fewer outputs or reduce them there."""
        return Keep(self.output_names)

    def response_bytes(self, spec: TaskSpec, prepared: Prepared, options: Any) -> int:
        """An upper estimate of the JSON bytes of one input's result (admission refuses what would pass the
        service's byte budgets before any inference): a few hundred bytes by default."""
        return 256 * max(1, len(prepared.items))

    def decode(self, tokenizer: Tokenizer, spec: TaskSpec, prepared: Sequence[Prepared],
               outputs: Sequence[Sequence[ItemOutputs]], options: Any) -> list[Any]:
        """One result per input from all the inputs' item outputs (`outputs[i][k]`: input i, item k), each what
        `keep` made of the item's rows."""
        raise NotImplementedError(f"{self.name}: no decode")

    # -- berth predict: a result as an output row ----------------------------------------------------------

    def row_layout(self, spec: TaskSpec, options: Any) -> RowLayout:
        """The columns a decoded result (with these options) becomes in an output row. Where the route answers
        an input with one object, its fields; where it answers with a list, one column of entries, the input's
        truncation repeated beside it where the entries carry one. By default a ValueError: not written."""
        raise ValueError(f"berth predict does not know how to write {self.name} results")

    # -- evaluation: the served steps, then the metric ----------------------------------------------------

    def served_input(self, example: Any) -> Any:
        """What a client would send for a dev example (its gold stays out)."""
        return example

    def score(self, spec: TaskSpec, examples: Sequence[Any], results: Sequence[Any]) -> tuple[dict[str, float], dict]:
        """Metrics of decoded results against the examples' gold, and spec updates (e.g. a chosen threshold)."""
        raise NotImplementedError(f"{self.name}: no metric")

    def report(self, spec: TaskSpec, examples: Sequence[Any], results: Sequence[Any]) -> dict[str, Any]:
        """What `berth evaluate` reports beyond the metrics (per label, per entity type); nothing by default."""
        return {}

    def headline_metric(self, metrics: dict[str, float]) -> tuple[str, float]:
        """The metric the parity gate guards and its scale to points (metrics in fractions: 100)."""
        return ("pearson" if "pearson" in metrics else "accuracy"), 100.0

    def evaluate(self, tokenizer: Tokenizer, spec: TaskSpec, examples: Sequence[Any], run: ItemRunner,
                 options: Any = None) -> tuple[dict[str, float], dict]:
        """Score a model (any runner) on dev examples through exactly the service's prepare -> run -> decode."""
        options = self.options() if options is None else options
        results = self.predict(tokenizer, spec, [self.served_input(e) for e in examples], run, options)
        return self.score(spec, examples, results)

    def predict(self, tokenizer: Tokenizer, spec: TaskSpec, inputs: Sequence[Any], run: ItemRunner,
                options: Any = None) -> list[Any]:
        """The service's answers for `inputs` (no HTTP, no batcher): prepare, run every item, decode."""
        options = self.options() if options is None else options
        prepared, outputs = self.run_prepared(tokenizer, spec, inputs, run, options)
        return self.decode(tokenizer, spec, prepared, outputs, options)

    def run_prepared(self, tokenizer: Tokenizer, spec: TaskSpec, inputs: Sequence[Any], run: ItemRunner,
                     options: Any) -> tuple[list[Prepared], list[list[ItemOutputs]]]:
        """Prepare every input, run all their items at once, and hand each input its items' outputs."""
        try:
            prepared = self.prepare_many(tokenizer, spec, inputs, options)
        except InputFailed as failed:
            raise failed.error from None
        items = [item for p in prepared for item in p.items]
        keep = self.keep(tokenizer, spec, options)
        flat = [keep(item, rows) for item, rows in zip(items, run(items, keep.names, self.per_token))]
        return prepared, per_input(prepared, flat)

    # -- the parity gate: what must not change between PyTorch and ONNX --------------------------------------

    def kept_rows(self, prepared: Prepared, name: str, rows: np.ndarray) -> np.ndarray:
        """The part of one item's output the parity gate keeps for `parity_answer` (all of it by default)."""
        return rows

    def parity_answer(self, tokenizer: Tokenizer, spec: TaskSpec, prepared: Prepared,
                      outputs: Sequence[ItemOutputs]) -> Hashable:
        """The served answer for one input, reduced to what must not change."""
        raise NotImplementedError(f"{self.name}: no parity answer")

    def confidence(self, spec: TaskSpec, prepared: Prepared, outputs: Sequence[ItemOutputs]) -> float:
        """How clearly the reference prefers its answer (top-1 minus runner-up probability); 1.0: always counts."""
        return 1.0

    # Dev files of the parity slice: under the shared data folder, else the repository's samples.
    parity_files: ClassVar[tuple[str, str] | None] = None

    def prepare_parity(self, tokenizer: Tokenizer, spec: TaskSpec, raw: Any) -> Prepared:
        """A parity input's items: as served by default."""
        return self.prepare(tokenizer, spec, raw, self.options())

    def parity_inputs(self, path: Path | None, size: int) -> list[Any]:
        """`size` real inputs (as `prepare` takes them) from `path`, or built-in ones when it is None."""
        raise NotImplementedError(f"{self.name}: no parity inputs")


def per_input(prepared: Sequence[Prepared], flat: Sequence[Any]) -> list[list[Any]]:
    """`flat` (one entry per model item, the inputs' items in order) cut back into one list per input."""
    out, at = [], 0
    for p in prepared:
        out.append(list(flat[at : at + len(p.items)]))
        at += len(p.items)
    return out
