"""What the foreign formats share: their bodies' strictness, berth request models built from them (a problem is
a 422 located in the foreign body, never a 500), options berth does not have refused by name, and labels
scored the way the caller asks (softmax, sigmoid or raw logits), every label ranked."""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

import numpy as np
import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, ValidationError

from service.errors import ErrorType, ServiceError
from service.handlers import TaskHandler, handler_for
from service.requests import request_model
from tasks.classification import REGRESSION, SINGLE_LABEL, resolve_problem_type
from tasks.common import sigmoid, softmax
from tasks.registry import DEFINITIONS, definition

Direction = Literal["left", "right", "Left", "Right"]  # huggingface_hub sends lowercase, TEI's schema names Right
ScoreFunction = Literal["softmax", "sigmoid", "none"]


class Strict(BaseModel):
    """A foreign body: unknown fields are refused (422 naming them), as on berth's own routes."""

    model_config = ConfigDict(extra="forbid")


def load_json(raw: bytes) -> Any:
    """A body read by a route itself: 400 for what is not JSON, as on the /v1 routes. The standard parser
    takes what orjson refuses but is valid JSON (an escaped unpaired surrogate), as service/fastpath.py."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                           "msg": f"Invalid JSON: {error}"}]) from None


def validated(model: type[BaseModel], value: Any, *where: str | int) -> Any:
    """`model` from `value` (a foreign body or a berth request built from one); a problem is a 422 whose
    location starts at `where` in the body the client sent."""
    try:
        return model.model_validate(value)
    except ValidationError as error:
        raise RequestValidationError([{**e, "loc": ("body", *where, *e["loc"])}
                                      for e in error.errors(include_url=False, include_input=False)]) from None


def refuse_prompt_name(prompt_name: str | None, where: str = "prompt_name") -> None:
    if prompt_name is not None:
        raise ServiceError(ErrorType.VALIDATION, f"{where}: prompts are not supported (a berth bundle carries no "
                           "sentence-transformers prompts); prepend the prompt's text to each input instead")


def refuse_left_truncation(direction: str | None, truncate: bool | None,
                           where: str = "truncation_direction") -> None:
    """berth cuts an over-long text at its end; cutting its start instead is refused, when a cut is allowed."""
    if truncate and direction is not None and direction.lower() == "left":
        raise ServiceError(ErrorType.VALIDATION, f"{where}: left is not supported; an over-long input is cut at "
                           "its end (right)")


class ScoredLabelsHandler(TaskHandler):
    """Per input, every label (or the `top_k` best) ranked by score, highest first: `[{label, score}]`. By default
    the scores are /v1/classify's (the same function of the same logits: softmax for a single-label model,
    sigmoid for multi-label, the raw output for regression); `function` asks for another. A regression model
    without label names answers "LABEL_0", as transformers names an unnamed label."""

    def finish(self, model, prepared, outputs, body) -> list[Any]:
        logits = np.asarray(np.stack([out[0]["logits"] for out in outputs]), dtype=np.float32)  # (N, C)
        count = logits.shape[1]
        kind = resolve_problem_type(model.spec.problem_type, count)
        names = list(model.spec.labels) if len(model.spec.labels) == count else [f"LABEL_{i}" for i in range(count)]
        function = body.function or ("none" if kind == REGRESSION else "softmax" if kind == SINGLE_LABEL
                                     else "sigmoid")
        scores = softmax(logits) if function == "softmax" else sigmoid(logits) if function == "sigmoid" else logits
        keep = count if body.top_k is None else min(body.top_k, count)
        ranked = np.argsort(-scores, axis=1, kind="stable")[:, :keep]
        return [[{"label": names[j], "score": float(scores[i, j])} for j in row] for i, row in enumerate(ranked)]


def takes_pairs(task: str) -> bool:
    """Is one input of `task` a {text, text_pair} pair (else a text)?"""
    return definition(task).input_fields == ("text", "text_pair")


def tasks_doing(pipeline_task: str) -> tuple[str, ...]:
    """The berth tasks whose models do what Hugging Face calls `pipeline_task`, in the registry's order."""
    return tuple(name for name, task in DEFINITIONS.items() if pipeline_task in task.pipeline_tasks)


@functools.cache
def scored_labels(task: str, route: str) -> ScoredLabelsHandler:
    """The adapter at `route` that scores every label of a `task` model (its request takes `function` too)."""
    own = handler_for(task, "inputs", route)
    return ScoredLabelsHandler(own.definition, own.endpoint, route)


@functools.cache
def scored_request(task: str) -> type[BaseModel]:
    """The request of `task`'s own route with `function`: None, the model's own (softmax, sigmoid, or none for
    regression)."""
    own = request_model(definition(task), definition(task).endpoints[0])
    return type(f"Scored{own.__name__}", (own,), {"__module__": __name__, "function": None,
                                                   "__annotations__": {"function": ScoreFunction | None}})
