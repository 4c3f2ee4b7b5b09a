"""Thin request adapters between a route and its task definition (tasks/registry.py), one per endpoint kind
(tasks/definition.py `Endpoint.kind`).

The task definition turns one input into model items (`prepare`) and the items' outputs into
results (`decode`), the same steps `berth evaluate` and the parity gate run, and refuses what it cannot take
(`check_options`, `check_input`, `check_prepared`: `Refusal`s, `TooLarge` for more than it takes, each naming the
option, input or field). An adapter adds only what is HTTP: the limits a setting caps (handed to the task as
numbers), where in the request an input is, the mapping of the task's refusals to 413 / 422 naming their place in
the request, and the response's shape. Every route's adapter is built from its
task's endpoint (`HANDLERS`, by path).
"""

from __future__ import annotations

import base64
import functools
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from service import token_ids
from service.errors import ErrorType, ServiceError
from service.models import ServedModel
from service.requests import request_model
from service.schemas import EmbeddingsRequest
from tasks.common import InputFailed, InputTooLong, Refusal, TooLarge
from tasks.definition import Endpoint, ItemOutputs, Prepared, ServingLimits, TaskDefinition
from tasks.embedding import cosine
from tasks.registry import DEFINITIONS, definition
from tasks.runtime.inference import Keep
from tasks.runtime.tokenizer import truncation

WORD_CHARACTER = re.compile(r"\w")  # a letter or digit: a text with one always gives its model a token

Outputs = list[ItemOutputs]  # one dict of output rows per model item


def request_path(refused: Refusal) -> str | None:
    """Where a task's refusal is in an "inputs" request: an option or the inputs as a whole by name (`layers`,
    `inputs`), input i as `inputs[i]`, a field of it as `inputs[i].choices`; None where the refusal names no place."""
    if refused.index is None:
        return refused.field
    return f"inputs[{refused.index}]" + ("" if refused.field is None else f".{refused.field}")


def service_error(refused: Refusal, message: str | None = None) -> ServiceError:
    """The HTTP error of a task's refusal: 413 for more than the task takes (`TooLarge`), else 422; its message
    the refusal's place in the request and reason, unless `message` is given."""
    kind = ErrorType.TOO_LARGE if isinstance(refused, TooLarge) else ErrorType.VALIDATION
    if message is None:
        path = request_path(refused)
        message = str(refused) if path is None else f"{path}: {refused}"
    return ServiceError(kind, message)


def serving_limits(settings: Any) -> ServingLimits:
    """The caps the task hooks check, as numbers, from the service's settings."""
    return ServingLimits(max_answer_length_cap=settings.max_answer_length_cap,
                         max_masks_per_input=settings.max_masks_per_input)


@contextmanager
def refusals_as_http() -> Iterator[None]:
    """A task hook's `Refusal` raised as its HTTP error."""
    try:
        yield
    except Refusal as refused:
        raise service_error(refused) from None


class TaskHandler:
    """The adapter of an "inputs" endpoint of `definition`'s task (`route`: where it is served, when not at
    the endpoint's own path: the metrics' route label)."""

    def __init__(self, definition: TaskDefinition, endpoint: Endpoint, route: str | None = None):
        self.definition = definition
        self.endpoint = endpoint
        self.task = definition.name
        self.route = route or endpoint.path
        self.request_model = request_model(definition, endpoint)
        self.truncates = "truncate" in (endpoint.options or definition.options).model_fields

    budget_hint = ""  # appended to the item and token budgets' 413: what the caller can do about it

    def texts(self, raw: Any) -> list[tuple[str, str]]:
        """(field name, text) of one input, for the limit checks."""
        return self.definition.texts(raw)

    def where(self, index: int, field: str, raw: Any) -> str:
        """Where a text of input `index` is in the request, for the messages that name it."""
        return f"inputs[{index}]" + ("" if isinstance(raw, str) else f".{field}")

    def check_count(self, inputs: list[Any], settings: Any) -> None:
        """How many inputs a request may send: at least one (422), at most max_inputs_per_request (413)."""
        if not inputs:
            raise ServiceError(ErrorType.VALIDATION, "inputs: the list is empty; send at least one input")
        if len(inputs) > settings.max_inputs_per_request:
            raise ServiceError(ErrorType.TOO_LARGE, f"inputs: {len(inputs)} inputs in one request; the limit is "
                               f"{settings.max_inputs_per_request} (max_inputs_per_request)")

    def check_inputs(self, inputs: list[Any], settings: Any) -> None:
        """The request limits (413) and what pydantic cannot say about the texts (422)."""
        self.check_count(inputs, settings)
        total = 0
        for index, raw in enumerate(inputs):
            for field, text in self.texts(raw):
                where = self.where(index, field, raw)
                if not text.strip():
                    raise ServiceError(ErrorType.VALIDATION, f"{where}: empty or only whitespace")
                if len(text) > settings.max_chars_per_input:
                    raise ServiceError(ErrorType.TOO_LARGE, f"{where}: {len(text)} characters; the limit is "
                                       f"{settings.max_chars_per_input} (max_chars_per_input)")
                total += len(text)
                if total > settings.max_chars_per_request:
                    raise ServiceError(ErrorType.TOO_LARGE, f"inputs: more than {settings.max_chars_per_request} "
                                       "characters in one request (max_chars_per_request); split it into several "
                                       "requests")
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as error:
                    raise ServiceError(ErrorType.VALIDATION, f"{where}: not valid Unicode text (an unpaired "
                                       f"surrogate at character {error.start})") from None

    def item_limit(self, prepared: list[Prepared], settings: Any) -> tuple[int, str]:
        """The most model items (sequences, windows) this request may make, and the name of that limit."""
        return settings.max_items_per_request, "max_items_per_request"

    def check_body(self, body: Any, settings: Any) -> None:
        """Request options a setting caps (422 naming it): the task's."""
        with refusals_as_http():
            self.definition.check_options(body, serving_limits(settings))

    def check_input(self, model: ServedModel, raw: Any, body: Any, index: int) -> None:
        """What the route refuses in one input before it is tokenized (a ServiceError naming it): the
        task's."""
        with refusals_as_http():
            self.definition.check_input(model.bundle, raw, body, index)

    def prepare(self, model: ServedModel, inputs: list[Any], body: Any) -> list[Prepared]:
        """Every input's items, the list tokenized at once (one `encode_batch`) where the task can. The error is
        the first input's, in request order, that the route's checks or the task refuse (as one by one)."""
        refused = None
        for index, raw in enumerate(inputs):
            try:
                self.check_input(model, raw, body, index)
                self.check_readable(model, raw, index)
            except ServiceError as error:
                refused, inputs = error, inputs[:index]  # an earlier input's task error still comes first
                break
        prepared = self.prepare_checked(model, inputs, body) if inputs else []
        if refused is not None:
            raise refused
        return prepared

    def check_readable(self, model: ServedModel, raw: Any, index: int) -> None:
        """A text made only of characters the model's tokenizer drops (NUL and other control characters, format
        characters such as a zero-width space or a byte-order mark, a lone combining accent) gives the model no
        token of it, only the special ones: 422, as an empty text is, not an answer about nothing (a label, a
        vector, "no answer" from a QA model that may not give one). A task whose empty answer is true of such a
        text (NER: no entities) answers it. Texts with a letter or digit, nearly all, are not tokenized twice."""
        if self.definition.answers_unread_text:
            return
        for field, text in self.texts(raw):
            if WORD_CHARACTER.search(text) is None and not model.tokenizer.encode(text, add_special_tokens=False).ids:
                raise ServiceError(ErrorType.VALIDATION, f"{self.where(index, field, raw)}: no text the model reads: "
                                   "only characters its tokenizer drops (control or format characters, lone accents)")

    def prepare_checked(self, model: ServedModel, inputs: list[Any], body: Any) -> list[Prepared]:
        try:
            return self.definition.prepare_many(model.tokenizer, model.spec, inputs, body)
        except InputFailed as failed:
            raise self.refusal(failed.error, f"inputs[{failed.index}]") from None

    def refusal(self, error: ValueError, where: str) -> ServiceError | ValueError:
        """The HTTP error for the task's refusal of the input at `where` (other errors stay what they are: a
        bug)."""
        if not isinstance(error, Refusal):
            return error
        cuttable = self.truncates and isinstance(error, InputTooLong)
        hint = "; send \"truncate\": true to cut it to fit" if cuttable else ""
        return service_error(error, f"{where}: {error}{hint}")

    def check_prepared(self, model: ServedModel, prepared: list[Prepared], body: Any, settings: Any) -> None:
        """What the route refuses once the inputs are tokenized (a ServiceError naming the input): the
        task's."""
        with refusals_as_http():
            self.definition.check_prepared(model.spec, prepared, body, serving_limits(settings))

    def keep(self, model: ServedModel, body: Any) -> Keep:
        """What each item keeps of its forward pass for this request (tasks/runtime/inference.py `Keep`)."""
        return self.definition.keep(model.tokenizer, model.spec, body)

    def response_bytes(self, model: ServedModel, prepared: list[Prepared], body: Any) -> int:
        """An upper estimate of the answer's JSON bytes, before any inference (the byte budgets)."""
        return sum(self.definition.response_bytes(model.spec, p, body) for p in prepared) + 256

    def finish(self, model: ServedModel, prepared: list[Prepared], outputs: list[Outputs], body: Any) -> list[Any]:
        return self.definition.decode(model.tokenizer, model.spec, prepared, outputs, body)

    def shape(self, model_name: str, results: list[Any]) -> Any:
        """The response body: `{"model", "results"}`; an endpoint kind with its own shape overrides it."""
        return {"model": model_name, "results": results}


class OpenAIEmbeddingsHandler(TaskHandler):
    """An "openai" endpoint (/v1/embeddings): the task's sentence embeddings in OpenAI's shape. An input is a
    text or, as OpenAI takes them, a list of token ids (service/token_ids.py)."""

    def texts(self, raw: str | list[int]) -> list[tuple[str, str]]:
        return [] if token_ids.is_ids(raw) else super().texts(raw)

    def check_body(self, body: EmbeddingsRequest, settings: Any) -> None:
        token_ids.check_id_lengths(body.inputs if isinstance(body.inputs, list) else [], settings, "input")

    def check_input(self, model: ServedModel, raw: str | list[int], body: EmbeddingsRequest, index: int) -> None:
        size = int(model.bundle.encoder_config.get("hidden_size", 0))
        if body.dimensions is not None and body.dimensions != size:
            raise ServiceError(ErrorType.VALIDATION, f"dimensions: {body.dimensions}; model {model.name!r} gives "
                               f"{size}-dimensional embeddings (shortening is not supported)")
        if token_ids.is_ids(raw):
            token_ids.check_ids(model, raw, f"input[{index}]")

    def prepare_checked(self, model: ServedModel, inputs: list[Any], body: EmbeddingsRequest) -> list[Prepared]:
        """As OpenAI: an input longer than the model takes is a 400 naming it and its token count, unless the
        request says `"truncate": true` (text-embeddings-inference's option), which cuts it and says so."""
        try:
            return token_ids.prepare_mixed(self.definition, model, inputs, body)
        except InputFailed as failed:
            if isinstance(failed.error, InputTooLong):
                raise ServiceError(ErrorType.VALIDATION, f"input[{failed.index}]: this model's maximum context "
                                   f"length is {failed.error.max_length} tokens, however the input is "
                                   f"{failed.error.num_tokens} tokens; shorten it, or send \"truncate\": true to "
                                   "cut it to fit", status=400) from None
            raise self.refusal(failed.error, f"input[{failed.index}]") from None

    def finish(self, model, prepared, outputs, body: EmbeddingsRequest) -> list[Any]:
        vectors = self.definition.sentence_vectors(model.spec, [out[0] for out in outputs], True)
        results = []
        for index, (vector, p) in enumerate(zip(vectors, prepared)):
            value = (base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                     if body.encoding_format == "base64" else vector.tolist())
            results.append({"object": "embedding", "index": index, "embedding": value, **truncation(p.state),
                            "tokens": len(p.state) + p.state.dropped})  # usage: what was sent, cut or not
        return results

    def shape(self, model_name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
        tokens = sum(result.pop("tokens") for result in results)
        return {"object": "list", "data": results, "model": model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


class SimilarityHandler(TaskHandler):
    """A "similarity" endpoint (/v1/similarity): the cosine of each input's `source` embedding with each of
    its `targets`' (1 to the endpoint's `max_texts`). Each input's source is free of max_items_per_request, so
    that one source takes the documented `max_texts` targets; its targets count against it."""

    def texts(self, raw: Any) -> list[tuple[str, str]]:
        return [("source", raw.source)] + [(f"targets[{i}]", t) for i, t in enumerate(raw.targets)]

    def check_input(self, model: ServedModel, raw: Any, body: Any, index: int) -> None:
        if not raw.targets:
            raise ServiceError(ErrorType.VALIDATION, f"inputs[{index}].targets: the list is empty; send at least one")
        limit = self.endpoint.max_texts
        if limit is not None and len(raw.targets) > limit:
            raise ServiceError(ErrorType.TOO_LARGE, f"inputs[{index}].targets: {len(raw.targets)} texts; the limit "
                               f"is {limit}")

    def prepare_checked(self, model: ServedModel, inputs: list[Any], body: Any) -> list[Prepared]:
        """Every text of every input (source, then targets) embedded as one list."""
        fields = [(index, field, text) for index, raw in enumerate(inputs) for field, text in self.texts(raw)]
        try:
            texts = self.definition.prepare_many(model.tokenizer, model.spec, [text for _, _, text in fields], body)
        except InputFailed as failed:
            index, field, _ = fields[failed.index]
            raise self.refusal(failed.error, f"inputs[{index}].{field}") from None
        prepared: list[Prepared] = [Prepared([]) for _ in inputs]
        for (index, _, _), text in zip(fields, texts):
            prepared[index].items.extend(text.items)
        return prepared

    def item_limit(self, prepared: list[Prepared], settings: Any) -> tuple[int, str]:
        return len(prepared) + settings.max_items_per_request, "one source per input + max_items_per_request"

    def response_bytes(self, model: ServedModel, prepared: list[Prepared], body: Any) -> int:
        return sum(32 * len(p.items) for p in prepared) + 256

    def finish(self, model, prepared, outputs, body) -> list[Any]:
        """Per input: `{"scores", "truncated_tokens"}` (tokens cut from the source, then each target)."""
        results = []
        for p, out in zip(prepared, outputs):
            vectors = self.definition.sentence_vectors(model.spec, out, True)
            results.append({"scores": cosine(vectors[0], vectors[1:]).tolist(),
                            "truncated_tokens": [item.dropped for item in p.items]})
        return results

    def shape(self, model_name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
        """`results` (the cosines per input) and, beside them, `truncated_tokens` per input: how many tokens
        were cut from the source and from each target (all 0 when nothing was cut)."""
        return {"model": model_name, "results": [r["scores"] for r in results],
                "truncated_tokens": [r["truncated_tokens"] for r in results]}


class RankingHandler(TaskHandler):
    """A "ranking" endpoint (/v1/rerank, and /v2/rerank where Cohere's v2 client posts): one query and its
    documents are the task's one input, answered in Cohere's shape. A document's first window is free of
    max_items_per_request (a request may send the endpoint's `max_texts` documents); the windows of long
    documents beyond it count against it, and every window's tokens, the query's included, against
    max_tokens_per_request."""

    budget_hint = "; max_tokens_per_doc cuts long documents to fewer windows, or send fewer documents"

    def where(self, index: int, field: str, raw: Any) -> str:
        return field  # "query", "documents[3]": the request's own fields

    def check_count(self, inputs: list[Any], settings: Any) -> None:
        documents, limit = len(inputs[0].documents), self.endpoint.max_texts
        if not documents:
            raise ServiceError(ErrorType.VALIDATION, "documents: the list is empty; send at least one document")
        if limit is not None and documents > limit:
            raise ServiceError(ErrorType.TOO_LARGE, f"documents: {documents} in one request; the limit is "
                               f"{limit}; split them over several requests")

    def item_limit(self, prepared: list[Prepared], settings: Any) -> tuple[int, str]:
        documents = sum(len(p.state.documents) for p in prepared)
        return documents + settings.max_items_per_request, "one window per document + max_items_per_request"

    def prepare_checked(self, model: ServedModel, inputs: list[Any], body: Any) -> list[Prepared]:
        try:
            return self.definition.prepare_many(model.tokenizer, model.spec, inputs, body)
        except InputFailed as failed:
            if isinstance(failed.error, InputTooLong):  # the query leaves no room for a document token
                raise ServiceError(ErrorType.TOO_LARGE, f"{failed.error}; shorten the query") from None
            raise self.refusal(failed.error, "query") from None

    def finish(self, model, prepared, outputs, body) -> list[Any]:
        ranked = self.definition.decode(model.tokenizer, model.spec, prepared, outputs, body)
        return [{"results": r, "tokens": sum(len(item) for item in p.items)} for r, p in zip(ranked, prepared)]

    def shape(self, model_name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
        """Cohere's v2 rerank response for the one input's ranking, with Jina's `model` and `usage`."""
        [answer] = results
        tokens = answer["tokens"]
        return {"id": str(uuid.uuid4()), "results": answer["results"],
                "meta": {"tokens": {"input_tokens": tokens}}, "model": model_name,
                "usage": {"total_tokens": tokens}}


ADAPTERS: dict[str, type[TaskHandler]] = {"inputs": TaskHandler, "similarity": SimilarityHandler,
                                          "openai": OpenAIEmbeddingsHandler, "ranking": RankingHandler}


def adapter(endpoint: Endpoint) -> type[TaskHandler]:
    """The adapter class of an endpoint's kind."""
    return ADAPTERS[endpoint.kind]


# Every served endpoint's adapter, by its path (the registry's order: each task's own endpoint first).
HANDLERS: dict[str, TaskHandler] = {endpoint.path: adapter(endpoint)(task, endpoint)
                                    for task in DEFINITIONS.values() for endpoint in task.endpoints}


@functools.cache
def handler_for(task: str, kind: str, route: str) -> TaskHandler:
    """The adapter of `task`'s first endpoint of `kind`, served at `route` (the foreign wire formats' routes).
    KeyError when the task has no endpoint of that kind."""
    found = next((e for e in definition(task).endpoints if e.kind == kind), None)
    if found is None:
        raise KeyError(f"task {task!r} has no {kind} endpoint")
    return adapter(found)(definition(task), found, route)
