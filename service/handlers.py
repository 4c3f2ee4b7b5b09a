"""Thin request adapters between a route and its task definition (tasks/registry.py).

The task definition turns one input into model items (`prepare`) and the items' outputs into
results (`decode`), the same steps `berth evaluate` and the parity gate run. An adapter adds only
what is HTTP: the limits a setting caps, and the mapping of the task layer's errors (an input too
long, a text without [MASK]) to 413 / 422 naming the input. Every route's adapter is looked up
from its task's definition; the embedding task has two more routes (OpenAI's shape, similarity).
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

from service import token_ids
from service.errors import ErrorType, ServiceError
from service.models import ServedModel
from service.schemas import (
    MAX_RERANK_DOCUMENTS,
    EmbeddingsRequest,
    RerankRequest,
    SimilarityInput,
    SimilarityRequest,
)
from tasks import embedding
from tasks.common import InputFailed, InputTooLong
from tasks.definition import ItemOutputs, Prepared, TaskDefinition
from tasks.fill_mask import NoMask
from tasks.inference import Keep
from tasks.qa import question_too_long
from tasks.registry import DEFINITIONS
from tasks.rerank import RerankInput
from tasks.tokenizer import truncation

Outputs = list[ItemOutputs]  # one dict of output rows per model item

MAX_TARGETS = 256  # texts compared with one source (/v1/similarity)
MAX_CHOICES = 64  # choices of one multiple-choice input (/v1/choice)
MAX_TOKEN_OUTPUT_INPUTS = 16  # /v1/embed with "output": "tokens" (up to ~4 MB of JSON per input)


class TaskHandler:
    """A route's adapter for `definition`'s task (`route`: when not the task's own route)."""

    def __init__(self, definition: TaskDefinition, route: str | None = None):
        self.definition = definition
        self.task = definition.name
        self.route = route or definition.route

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

    def item_limit(self, prepared: list[Prepared], settings: Any) -> tuple[int, str]:
        """The most model items (sequences, windows) this request may make, and the name of that limit."""
        return settings.max_items_per_request, "max_items_per_request"

    def check_body(self, body: Any, settings: Any) -> None:
        """Request options a setting caps (422 naming it); nothing by default."""

    def check_input(self, model: ServedModel, raw: Any, body: Any, index: int) -> None:
        """What the route refuses in one input before it is tokenized (a ServiceError naming it); nothing by default."""

    def prepare(self, model: ServedModel, inputs: list[Any], body: Any) -> list[Prepared]:
        """Every input's items, the list tokenized at once (one `encode_batch`) where the task can. The error is
        the first input's, in request order, that the route's checks or the task refuse (as one by one)."""
        refused = None
        for index, raw in enumerate(inputs):
            try:
                self.check_input(model, raw, body, index)
            except ServiceError as error:
                refused, inputs = error, inputs[:index]  # an earlier input's task error still comes first
                break
        prepared = self.prepare_checked(model, inputs, body) if inputs else []
        if refused is not None:
            raise refused
        return prepared

    def prepare_checked(self, model: ServedModel, inputs: list[Any], body: Any) -> list[Prepared]:
        try:
            return self.definition.prepare_many(model.tokenizer, model.spec, inputs, body)
        except InputFailed as failed:
            raise refusal(failed.error, f"inputs[{failed.index}]", body) from None

    def check_prepared(self, model: ServedModel, prepared: list[Prepared], body: Any, settings: Any) -> None:
        """What the route refuses once the inputs are tokenized (a ServiceError naming the input); nothing by default."""

    def keep(self, model: ServedModel, body: Any) -> Keep:
        """What each item keeps of its forward pass for this request (tasks/inference.py `Keep`)."""
        return self.definition.keep(model.tokenizer, model.spec, body)

    def response_bytes(self, model: ServedModel, prepared: list[Prepared], body: Any) -> int:
        """An upper estimate of the answer's JSON bytes, before any inference (the byte budgets)."""
        return sum(self.definition.response_bytes(model.spec, p, body) for p in prepared) + 256

    def finish(self, model: ServedModel, prepared: list[Prepared], outputs: list[Outputs], body: Any) -> list[Any]:
        return self.definition.decode(model.tokenizer, model.spec, prepared, outputs, body)


class QAHandler(TaskHandler):
    def check_body(self, body: Any, settings: Any) -> None:
        if body.max_answer_length > settings.max_answer_length_cap:
            raise ServiceError(ErrorType.VALIDATION, f"max_answer_length: {body.max_answer_length} tokens; the limit "
                               f"is {settings.max_answer_length_cap} (max_answer_length_cap)")

    def check_prepared(self, model: ServedModel, prepared: list[Prepared], body: Any, settings: Any) -> None:
        """A question longer than the model's max_query_length would be cut: refused instead, never cut silently."""
        for index, p in enumerate(prepared):
            if too_long := question_too_long(model.spec, p):
                raise ServiceError(ErrorType.TOO_LARGE, f"inputs[{index}].question: {too_long}; shorten the question")


class FillMaskHandler(TaskHandler):
    def check_prepared(self, model: ServedModel, prepared: list[Prepared], body: Any, settings: Any) -> None:
        for index, p in enumerate(prepared):
            masks = len(p.state[1])
            if masks > settings.max_masks_per_input:
                raise ServiceError(ErrorType.TOO_LARGE, f"inputs[{index}]: {masks} [MASK] tokens; the limit is "
                                   f"{settings.max_masks_per_input} per input (max_masks_per_input)")


class ChoiceHandler(TaskHandler):
    def check_input(self, model: ServedModel, raw: Any, body: Any, index: int) -> None:
        if len(raw.choices) < 2:
            raise ServiceError(ErrorType.VALIDATION, f"inputs[{index}].choices: {len(raw.choices)} given; a "
                               "multiple-choice input needs at least 2")
        if len(raw.choices) > MAX_CHOICES:
            raise ServiceError(ErrorType.TOO_LARGE, f"inputs[{index}].choices: {len(raw.choices)} given; the limit "
                               f"is {MAX_CHOICES}")


class EmbedHandler(TaskHandler):
    def check_input(self, model: ServedModel, raw: str, body: Any, index: int) -> None:
        if getattr(body, "output", "sentence") == "tokens":
            if index >= MAX_TOKEN_OUTPUT_INPUTS:
                raise ServiceError(ErrorType.TOO_LARGE, f"inputs: \"output\": \"tokens\" takes at most "
                                   f"{MAX_TOKEN_OUTPUT_INPUTS} inputs per request")
            try:
                embedding.check_layers(body.layers, int(model.bundle.encoder_config.get("num_hidden_layers", 0)))
            except ValueError as error:
                raise ServiceError(ErrorType.VALIDATION, f"layers: {error}") from None
        elif getattr(body, "layers", [-1]) != [-1]:
            raise ServiceError(ErrorType.VALIDATION, "layers: only with \"output\": \"tokens\" (sentence vectors "
                               "pool the last layer)")


class OpenAIEmbeddingsHandler(EmbedHandler):
    """/v1/embeddings: the same embeddings; `openai_payload` gives the response OpenAI's shape. An input is a
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
        super().check_input(model, raw, body, index)

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
            raise refusal(failed.error, f"input[{failed.index}]", body) from None

    def finish(self, model, prepared, outputs, body: EmbeddingsRequest) -> list[Any]:
        vectors = self.definition.sentence_vectors(model.spec, [out[0] for out in outputs], True)
        results = []
        for index, (vector, p) in enumerate(zip(vectors, prepared)):
            value = (base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                     if body.encoding_format == "base64" else vector.tolist())
            results.append({"object": "embedding", "index": index, "embedding": value, **truncation(p.state),
                            "tokens": len(p.state) + p.state.dropped})  # usage: what was sent, cut or not
        return results


def refusal(error: ValueError, where: str, body: Any) -> ServiceError | ValueError:
    """The HTTP error for a task's refusal of the input at `where` (other errors stay what they are: a bug)."""
    if isinstance(error, InputTooLong):
        hint = "; send \"truncate\": true to cut it to fit" if hasattr(body, "truncate") else ""
        return ServiceError(ErrorType.TOO_LARGE, f"{where}: {error}{hint}")
    if isinstance(error, NoMask):
        return ServiceError(ErrorType.VALIDATION, f"{where}: {error}")
    return error


def openai_payload(model_name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = sum(result.pop("tokens") for result in results)
    return {"object": "list", "data": results, "model": model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


class SimilarityHandler(TaskHandler):
    """/v1/similarity: the cosine of a source's embedding with each target's."""

    def texts(self, raw: SimilarityInput) -> list[tuple[str, str]]:
        return [("source", raw.source)] + [(f"targets[{i}]", t) for i, t in enumerate(raw.targets)]

    def check_input(self, model: ServedModel, raw: SimilarityInput, body: SimilarityRequest, index: int) -> None:
        if not raw.targets:
            raise ServiceError(ErrorType.VALIDATION, f"inputs[{index}].targets: the list is empty; send at least one")
        if len(raw.targets) > MAX_TARGETS:
            raise ServiceError(ErrorType.TOO_LARGE, f"inputs[{index}].targets: {len(raw.targets)} texts; the limit "
                               f"is {MAX_TARGETS}")

    def prepare_checked(self, model: ServedModel, inputs: list[SimilarityInput], body: SimilarityRequest) -> list[Prepared]:
        """Every text of every input (source, then targets) embedded as one list."""
        fields = [(index, field, text) for index, raw in enumerate(inputs) for field, text in self.texts(raw)]
        try:
            texts = self.definition.prepare_many(model.tokenizer, model.spec, [text for _, _, text in fields], body)
        except InputFailed as failed:
            index, field, _ = fields[failed.index]
            raise refusal(failed.error, f"inputs[{index}].{field}", body) from None
        prepared: list[Prepared] = [Prepared([]) for _ in inputs]
        for (index, _, _), text in zip(fields, texts):
            prepared[index].items.extend(text.items)
        return prepared

    def response_bytes(self, model: ServedModel, prepared: list[Prepared], body: Any) -> int:
        return sum(32 * len(p.items) for p in prepared) + 256

    def finish(self, model, prepared, outputs, body) -> list[Any]:
        """Per input: `{"scores", "truncated_tokens"}` (tokens cut from the source, then each target);
        `similarity_payload` puts them in the response."""
        results = []
        for p, out in zip(prepared, outputs):
            vectors = self.definition.sentence_vectors(model.spec, out, True)
            results.append({"scores": embedding.cosine(vectors[0], vectors[1:]).tolist(),
                            "truncated_tokens": [item.dropped for item in p.items]})
        return results


def similarity_payload(model_name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """`results` as before (the cosines per input) and, beside them, `truncated_tokens` per input: how many tokens
    were cut from the source and from each target (all 0 when nothing was cut)."""
    return {"model": model_name, "results": [r["scores"] for r in results],
            "truncated_tokens": [r["truncated_tokens"] for r in results]}


class RerankHandler(TaskHandler):
    """/v1/rerank (and /v2/rerank, where Cohere's v2 client posts): one query and its documents are the task's one
    input; `rerank_payload` gives the answer Cohere's shape. A document's first window is free of
    max_items_per_request (a request may send MAX_RERANK_DOCUMENTS documents); the windows of long documents
    beyond it count against it, and every window's tokens, the query's included, against max_tokens_per_request."""

    budget_hint = "; max_tokens_per_doc cuts long documents to fewer windows, or send fewer documents"

    def where(self, index: int, field: str, raw: RerankInput) -> str:
        return field  # "query", "documents[3]": the request's own fields

    def check_count(self, inputs: list[RerankInput], settings: Any) -> None:
        documents = len(inputs[0].documents)
        if not documents:
            raise ServiceError(ErrorType.VALIDATION, "documents: the list is empty; send at least one document")
        if documents > MAX_RERANK_DOCUMENTS:
            raise ServiceError(ErrorType.TOO_LARGE, f"documents: {documents} in one request; the limit is "
                               f"{MAX_RERANK_DOCUMENTS}; split them over several requests")

    def item_limit(self, prepared: list[Prepared], settings: Any) -> tuple[int, str]:
        documents = sum(len(p.state.documents) for p in prepared)
        return documents + settings.max_items_per_request, "one window per document + max_items_per_request"

    def prepare_checked(self, model: ServedModel, inputs: list[RerankInput], body: RerankRequest) -> list[Prepared]:
        try:
            return self.definition.prepare_many(model.tokenizer, model.spec, inputs, body)
        except InputFailed as failed:
            if isinstance(failed.error, InputTooLong):  # the query leaves no room for a document token
                raise ServiceError(ErrorType.TOO_LARGE, f"{failed.error}; shorten the query") from None
            raise refusal(failed.error, "query", body) from None

    def finish(self, model, prepared, outputs, body: RerankRequest) -> list[Any]:
        ranked = self.definition.decode(model.tokenizer, model.spec, prepared, outputs, body)
        return [{"results": r, "tokens": sum(len(item) for item in p.items)} for r, p in zip(ranked, prepared)]


def rerank_payload(model_name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Cohere's v2 rerank response for the one input's ranking, with Jina's `model` and `usage`."""
    [answer] = results
    tokens = answer["tokens"]
    return {"id": str(uuid.uuid4()), "results": answer["results"], "meta": {"tokens": {"input_tokens": tokens}},
            "model": model_name, "usage": {"total_tokens": tokens}}


# Each task's own route; a task whose route needs more than the definition has its adapter class here.
_ADAPTERS: dict[str, type[TaskHandler]] = {"qa": QAHandler, "multiple-choice": ChoiceHandler, "embedding": EmbedHandler,
                                            "fill-mask": FillMaskHandler, "rerank": RerankHandler}
HANDLERS: dict[str, TaskHandler] = {name: _ADAPTERS.get(name, TaskHandler)(definition)
                                    for name, definition in DEFINITIONS.items() if definition.route}
OPENAI_EMBEDDINGS = OpenAIEmbeddingsHandler(DEFINITIONS["embedding"], "/v1/embeddings")
SIMILARITY = SimilarityHandler(DEFINITIONS["embedding"], "/v1/similarity")
