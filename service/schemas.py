"""Request and response bodies of the /v1 routes, with the examples shown in /docs.

`inputs` is one input or a list of them; the response always holds a list of results, one per
input, in input order. All character offsets (`start`, `end`) are Python str indices (Unicode code
points) into the caller's own string, end exclusive: `text[start:end] == entity text` and
`context[start:end] == answer`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.token_ids import TokenIds, as_inputs
from tasks.classification import ClassifyOptions
from tasks.embedding import EmbedOptions
from tasks.fill_mask import FillMaskOptions
from tasks.multiple_choice import ChoiceOptions
from tasks.ner import NEROptions
from tasks.qa import QAOptions
from tasks.rerank import RerankInput, RerankOptions

OFFSETS_NOTE = ("Offsets are Python str indices (code points) into the caller's original string, end exclusive: "
                "text[start:end] is the span's text.")


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="bundle name (see GET /v1/models); default: the first model of "
                                                "this route's task, by name")


class ClassifyRequest(ClassifyOptions, _Request):
    inputs: str | list[str] = Field(description="a text or a list of texts")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"inputs": "A charming and often affecting journey."},
        {"inputs": ["Unflinchingly bleak and desperate.", "A gorgeous, witty, seductive movie."], "top_k": 2},
    ]})


class TextPair(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str
    text_pair: str


class PairRequest(ClassifyOptions, _Request):
    inputs: TextPair | list[TextPair] = Field(description="a {text, text_pair} object or a list of them")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"inputs": {"text": "The cat sat on the mat.", "text_pair": "A cat was sitting on a mat."}},
    ]})


class NERRequest(NEROptions, _Request):
    inputs: str | list[str] = Field(description="a text or a list of texts, of any length up to the character "
                                                "limit: long texts are read in overlapping windows")
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"inputs": "Peter Blackburn met officials of the World Health Organization in Geneva."},
    ]})


class QAInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str
    context: str


class QARequest(QAOptions, _Request):
    inputs: QAInput | list[QAInput] = Field(description="a {question, context} object or a list of them; "
                                                        "long contexts are read in overlapping windows")
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"inputs": {"question": "Where is Normandy?",
                    "context": "The Normans gave their name to Normandy, a region in France."}},
    ]})


class _TruncatingRequest(ChoiceOptions, _Request):
    """A request whose only option is `truncate`."""


class EmbedRequest(EmbedOptions, _Request):
    inputs: str | list[str] = Field(description="a text or a list of texts")
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"inputs": ["A man is playing a guitar.", "Someone plays an instrument."]},
        {"inputs": "Tim Cook visited Berlin.", "output": "tokens", "layers": [-1, -2, -3, -4]},
    ]})


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request (what LangChain, LlamaIndex and the `openai` client send)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    inputs: str | list[str] | TokenIds | list[TokenIds] = Field(
        validation_alias="input", description="a text, a list of texts, or token ids as OpenAI takes them: one list "
                                              "of ids or a list of such lists (each wrapped in [CLS] ... [SEP])")
    model: str | None = Field(None, description="bundle name (see GET /v1/models); default: the first embedding model")
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32 bytes")
    dimensions: int | None = Field(None, ge=1, description="must equal the model's size when given (no shortening)")
    user: str | None = Field(None, description="accepted and ignored")

    truncate: bool = Field(False, description="cut an input longer than the model's max_seq_length (the result says "
                                              "\"truncated\": true and how many tokens were cut); false (OpenAI's "
                                              "behaviour): such an input is refused with 400 naming it")

    @field_validator("inputs")
    @classmethod
    def _one_id_list_is_one_input(cls, value: Any) -> Any:
        return as_inputs(value)

    @property
    def normalize(self) -> bool:
        return True  # OpenAI's embeddings are unit length; clients may rely on dot product == cosine


class SimilarityInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str
    targets: list[str] = Field(description="1 to 256 texts compared with source")


class SimilarityRequest(_TruncatingRequest):
    inputs: SimilarityInput | list[SimilarityInput] = Field(description="a {source, targets} object or a list")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"inputs": {"source": "A man is playing a guitar.",
                    "targets": ["Someone plays an instrument.", "A chef is cooking pasta."]}},
    ]})


class FillMaskRequest(FillMaskOptions, _Request):
    inputs: str | list[str] = Field(description="a text or a list of texts, each with at least one [MASK]")
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"inputs": "Paris is the [MASK] of France.", "top_k": 3},
    ]})


class ChoiceInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context: str
    choices: list[str] = Field(description="2 to 64 candidate continuations or answers")


class ChoiceRequest(ChoiceOptions, _Request):
    inputs: ChoiceInput | list[ChoiceInput] = Field(description="a {context, choices} object or a list of them")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"inputs": {"context": "She opened the umbrella because",
                    "choices": ["it started to rain.", "the soup was cold.", "the train left."]}},
    ]})


MAX_RERANK_DOCUMENTS = 1_000  # documents of one /v1/rerank request (more: 413), Cohere's recommended most


class RerankDocument(BaseModel):
    """A document as an object, as Jina's API and Cohere's v1 take it (only `text`)."""

    model_config = ConfigDict(extra="forbid")

    text: str


class RerankRequest(RerankOptions, _Request):
    """Cohere's v2 rerank request (what `cohere.ClientV2.rerank` sends), which is also Jina's and Cohere v1's:
    `return_documents`, and documents as strings or `{"text"}` objects, mixed."""

    query: str = Field(description="the search query")
    documents: list[str | RerankDocument] = Field(
        description=f"1 to {MAX_RERANK_DOCUMENTS:,} texts (or {{\"text\"}} objects) ranked against the query; a "
                    "long one is read in overlapping windows and scored by its best window")
    priority: int | None = Field(None, description="Cohere's scheduling hint: accepted and ignored")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"model": "ranker", "query": "What is the capital of the United States?", "top_n": 2,
         "documents": ["Carson City is the capital city of the American state of Nevada.",
                       "Washington, D.C. is the capital of the United States.",
                       "Capital gains are profits from the sale of an asset."]},
        {"query": "Which city has the tallest tower?", "return_documents": True,
         "documents": [{"text": "Dubai's Burj Khalifa is 828 metres tall."}, "Paris has the Eiffel Tower."]},
    ]})

    @property
    def inputs(self) -> RerankInput:
        """The task layer's one input: the query and every document as its text (validated above already)."""
        texts = [d if isinstance(d, str) else d.text for d in self.documents]
        return RerankInput.model_construct(query=self.query, documents=texts)


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
