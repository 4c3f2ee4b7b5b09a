"""Response bodies of the /v1 routes and OpenAI's embeddings request; the task routes' requests are built
from the task definitions (service/requests.py), with the examples shown in /docs.

`inputs` is one input or a list of them; the response always holds a list of results, one per
input, in input order. All character offsets (`start`, `end`) are Python str indices (Unicode code
points) into the caller's own string, end exclusive: `text[start:end] == entity text` and
`context[start:end] == answer`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.token_ids import TokenIds, as_inputs
from tasks.common import OFFSETS_NOTE


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request (what LangChain, LlamaIndex and the `openai` client send)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    inputs: str | list[str] | TokenIds | list[TokenIds] = Field(
        validation_alias="input", description="a text, a list of texts, or token ids as OpenAI takes them: one list "
                                              "of ids or a list of such lists (each wrapped in [CLS] ... [SEP])")
    model: str | None = Field(None, description="bundle name (see GET /v1/models); default: the first embedding model")
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32 bytes")
    dimensions: int | None = Field(None, strict=True, ge=1,
                                   description="must equal the model's size when given (no shortening)")
    user: str | None = Field(None, description="accepted and ignored")

    truncate: bool = Field(
        False, strict=True, description="cut an input longer than the model's max_seq_length (the result says "
                                        "\"truncated\": true and how many tokens were cut); false (OpenAI's "
                                        "behaviour): such an input is refused with 400 naming it")

    @field_validator("inputs")
    @classmethod
    def _one_id_list_is_one_input(cls, value: Any) -> Any:
        return as_inputs(value)

    @property
    def normalize(self) -> bool:
        return True  # OpenAI's embeddings are unit length; clients may rely on dot product == cosine


class RerankDocument(BaseModel):
    """A document as an object, as Jina's API and Cohere's v1 take it (only `text`)."""

    model_config = ConfigDict(extra="forbid")

    text: str


class _Result(BaseModel):
    """A result as sent: a field the handlers add but the schema does not declare fails the response check."""

    model_config = ConfigDict(extra="forbid")


class Embedding(_Result):
    embedding: list[float] | None = Field(None, description="sentence output: the pooled vector")
    tokens: list[dict[str, Any]] | None = Field(None, description="tokens output: {token, start, end, embedding} per "
                                                                  "text token. " + OFFSETS_NOTE)
    truncated: bool = False
    truncated_tokens: int = Field(0, description="tokens cut from the input (0 when it fit)")


class EmbedResponse(_Result):
    model: str
    results: list[Embedding]


class SimilarityResponse(_Result):
    model: str
    results: list[list[float]] = Field(description="per input: the cosine of source with each target, in order")
    truncated_tokens: list[list[int]] = Field(description="per input: tokens cut from the source, then from each "
                                                          "target (all 0 when every text fit; `truncate` false refuses "
                                                          "a text that does not fit with 413)")


class FilledToken(_Result):
    score: float
    token: int
    token_str: str
    sequence: str = Field(description="the text with this token in place of the [MASK]")


class FillMaskResponse(_Result):
    model: str
    results: list[list[FilledToken] | list[list[FilledToken]]] = Field(
        description="per input: the top_k candidates (one [MASK]) or a list of them per [MASK], as transformers' "
                    "fill-mask pipeline")


class RankedChoice(_Result):
    index: int = Field(description="position of the choice in the request")
    choice: str
    score: float = Field(description="softmax probability over this input's choices")
    truncated: bool = False
    truncated_tokens: int = Field(0, description="tokens cut from the context and this choice (0 when they fit)")


class ChoiceResponse(_Result):
    model: str
    results: list[list[RankedChoice]] = Field(description="per input: its choices, most probable first")


class Label(_Result):
    label: str | None = None
    score: float
    truncated: bool = False
    truncated_tokens: int = Field(0, description="tokens cut from the input (0 when it fit)")


class Entity(_Result):
    entity: str = Field(description="entity type (the raw tag with aggregation none)")
    text: str
    start: int = Field(description=OFFSETS_NOTE)
    end: int
    score: float


class Answer(_Result):
    answer: str
    start: int = Field(description=OFFSETS_NOTE)
    end: int
    score: float
    is_impossible: bool


class ClassifyResponse(_Result):
    model: str
    results: list[Label | list[Label]] = Field(
        description="per input: {label, score, truncated}; with top_k a ranked list; regression: {score}")


class NERResponse(_Result):
    model: str
    results: list[list[Entity]] = Field(description="per input: its entities in text order. " + OFFSETS_NOTE)


class QAResponse(_Result):
    model: str
    results: list[Answer | list[Answer]] = Field(description="per input: the best answer; with top_k > 1 a ranked "
                                                             "list. " + OFFSETS_NOTE)


class OpenAIEmbedding(_Result):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="the unit vector, or with encoding_format base64 its "
                                                     "little-endian float32 bytes")
    truncated: bool = Field(False, description="true only with \"truncate\": true and an input that did not fit")
    truncated_tokens: int = Field(0, description="tokens cut from the input")


class Usage(_Result):
    prompt_tokens: int = Field(description="tokens of the inputs as sent (special tokens included), also those cut")
    total_tokens: int


class EmbeddingsResponse(_Result):
    """OpenAI's embeddings response."""

    object: Literal["list"]
    data: list[OpenAIEmbedding]
    model: str
    usage: Usage


class RerankedText(_Result):
    text: str


class RerankResult(_Result):
    index: int = Field(description="position of the document in the request's list")
    relevance_score: float = Field(description="0 to 1: the sigmoid of the cross-encoder's logit for the document's "
                                               "best window")
    truncated: bool = Field(description="the document was cut to max_tokens_per_doc before it was read (without "
                                        "that option nothing is cut: a long document is read in windows)")
    document: RerankedText | None = Field(None, description="with return_documents: the document's text")


class RerankTokens(_Result):
    input_tokens: int = Field(description="tokens the model read: every window of every document with the query "
                                          "and the special tokens")


class RerankMeta(_Result):
    tokens: RerankTokens


class RerankUsage(_Result):
    total_tokens: int = Field(description="as meta.tokens.input_tokens (Jina's name)")


class RerankResponse(_Result):
    """Cohere's v2 rerank response (`id`, `results`, `meta`), with Jina's `model` and `usage`; each result also says
    whether its document was `truncated`."""

    id: str = Field(description="a new UUID per answer")
    model: str
    results: list[RerankResult] = Field(description="the documents, most relevant first (ties in request order); "
                                                    "the first top_n when given")
    meta: RerankMeta
    usage: RerankUsage


class ErrorBody(BaseModel):
    error: str = Field(description="human-readable message")
    error_type: Literal["validation", "not_found", "too_large", "overloaded", "timeout", "unauthorized", "internal"]
    detail: list[dict[str, Any]] | None = Field(None, description="field-level problems (validation errors)")


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "the body is not JSON (malformed, or nested too deep); /v1/embeddings: "
                                             "an input longer than the model takes (without truncate)"},
    401: {"model": ErrorBody, "description": "missing or wrong API key"},
    404: {"model": ErrorBody, "description": "unknown model, or no model of this route's task"},
    413: {"model": ErrorBody, "description": "body, input count, input length or (truncate false) tokens too large"},
    422: {"model": ErrorBody, "description": "invalid body, or a model of another task (the message names its route)"},
    429: {"model": ErrorBody, "description": "busy: the model's queue, the requests in progress, the bodies arriving "
                                             "or the answers in progress are at their limit; retry after the "
                                             "Retry-After header's seconds"},
    503: {"model": ErrorBody, "description": "not ready: starting, shutting down, or the model is failing (its canary "
                                             "pass retries it); Retry-After"},
    504: {"model": ErrorBody, "description": "not answered within the request timeout"},
}


# The response schemas the task definitions' endpoints name (tasks/definition.py `Endpoint.response`).
# The compatibility routes' statuses, in the same error body.
TEI_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    **{status: ERROR_RESPONSES[status] for status in (413, 429, 503, 504)},
    400: {"model": ErrorBody, "description": "the body is not JSON, or an input the route cannot take (TEI's "
                                             "Validation errors)"},
    422: {"model": ErrorBody, "description": "invalid body (TEI's Validation errors)"},
    424: {"model": ErrorBody, "description": "no model of this route's kind is served, or an option the model cannot "
                                             "do (TEI's Backend errors); the message names the setting"},
}
HF_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    **{status: ERROR_RESPONSES[status] for status in (400, 401, 413, 422, 429, 503, 504)},
    404: {"model": ErrorBody, "description": "no model of this name is served"},
}


RESPONSES: dict[str, type[BaseModel]] = {model.__name__: model for model in (
    ClassifyResponse, NERResponse, QAResponse, EmbedResponse, EmbeddingsResponse, SimilarityResponse,
    FillMaskResponse, ChoiceResponse, RerankResponse)}
