"""The request models of the task routes, built from the task definitions' endpoints (tasks/definition.py
`Endpoint`): the endpoint's options (the task's own unless it declares others), an optional `model` name and
its inputs, as the endpoint's kind carries them. OpenAI's embeddings request is OpenAI's own
(service/schemas.py `EmbeddingsRequest`)."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from service.schemas import EmbeddingsRequest, RerankDocument
from tasks.definition import Endpoint, InputField, TaskDefinition


class TaskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="bundle name (see GET /v1/models); default: the first model "
                                                "of this route's task, by name")


class RankingRequest(TaskRequest):
    """Cohere's v2 rerank request (what `cohere.ClientV2.rerank` sends), which is also Jina's and Cohere v1's:
    `return_documents`, and documents as strings or `{"text"}` objects, mixed."""

    input_fields: ClassVar[tuple[str, ...]] = ()  # the fields of the task's one input (`request_model`)

    @property
    def inputs(self) -> SimpleNamespace:
        """The task's one input: its fields, every document as its text (validated already)."""
        return SimpleNamespace(**{name: _as_texts(getattr(self, name)) for name in self.input_fields})


def _as_texts(value: Any) -> Any:
    """A list of texts and `{"text"}` objects as texts; anything else as it is."""
    return [item if isinstance(item, str) else item.text for item in value] if isinstance(value, list) else value


@functools.cache
def request_model(definition: TaskDefinition, endpoint: Endpoint) -> type[BaseModel]:
    """The request model of `endpoint` (one class per endpoint: its schema name is `endpoint.request`)."""
    if endpoint.kind == "openai":
        return EmbeddingsRequest
    options = endpoint.options or definition.options
    examples = {"json_schema_extra": {"examples": list(endpoint.examples)}} if endpoint.examples else {}
    namespace: dict[str, Any] = {"__module__": __name__, "__qualname__": endpoint.request,
                                 "model_config": ConfigDict(extra="forbid", **examples)}
    if endpoint.kind == "ranking":
        for field in endpoint.fields:
            _declare(namespace, field.name, list[str | RerankDocument] if field.many else str,
                     Field(description=field.description))
        _declare(namespace, "priority", int | None,
                 Field(None, description="Cohere's scheduling hint: accepted and ignored"))
        namespace["__doc__"] = RankingRequest.__doc__
        model = type(endpoint.request, (options, RankingRequest), namespace)
        model.input_fields = tuple(field.name for field in endpoint.fields)
        return model
    one = input_object(endpoint.input_object, endpoint.fields) if endpoint.fields else str
    _declare(namespace, "inputs", one | list[one],  # type: ignore[operator]
             Field(description=endpoint.inputs_description))
    return type(endpoint.request, (options, TaskRequest), namespace)


def input_object(name: str | None, fields: tuple[InputField, ...]) -> type[BaseModel]:
    """The model of one input object: a text or a list of texts per field."""
    namespace: dict[str, Any] = {"__module__": __name__, "__qualname__": name,
                                 "model_config": ConfigDict(extra="forbid")}
    for field in fields:
        _declare(namespace, field.name, list[str] if field.many else str,
                 Field(description=field.description))
    return type(name or "Input", (BaseModel,), namespace)


def _declare(namespace: dict[str, Any], name: str, annotation: Any, default: Any) -> None:
    namespace.setdefault("__annotations__", {})[name] = annotation
    namespace[name] = default
