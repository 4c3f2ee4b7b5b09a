"""Reranking with a cross-encoder: a query and its documents -> the documents by relevance. Torch-free.

Each (query, document) pair is one sequence `[CLS] query [SEP] document [SEP]` (token types 0 then 1)
and the head (`BertForSequenceClassification` with one label, the paper's sentence-pair head) gives it
one relevance logit; the served `relevance_score` is its sigmoid. A document longer than the room the
query leaves is read in overlapping windows (every token in at least one) and scored by its best
window: nothing is cut unless the request asks for it with `max_tokens_per_doc`, and then the result
says `"truncated": true`. A query that leaves no room for a single document token is refused.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from tokenizers import Tokenizer

from tasks.common import InputFailed, InputTooLong, margin, sigmoid
from tasks.definition import (
    Endpoint,
    InputField,
    ListOf,
    Prepared,
    RowLayout,
    StructOf,
    TaskDefinition,
    columns,
)
from tasks.qa import window_spans
from tasks.runtime.inference import Keep
from tasks.runtime.tokenizer import CLS, SEP, ids_batch_encoder

SPECIAL_TOKENS_PER_SEQUENCE = 3  # [CLS] query [SEP] document [SEP]
MRR_CUTOFF = 10
MAX_DOCUMENTS = 1_000  # documents of one served request (more: 413), Cohere's recommended most


class RerankInput(BaseModel):
    """One input of /v1/rerank: a query and the documents to rank for it."""

    query: str
    documents: list[str]


class RerankOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    top_n: int | None = Field(None, strict=True, ge=1,
                              description="return the n most relevant documents per query; default: all")
    return_documents: bool = Field(False, strict=True, description="each result also carries its document's text")
    max_tokens_per_doc: int | None = Field(
        None, strict=True, ge=1,
        description="cut every document to this many tokens first (the result says \"truncated\": "
                    "true); default: no cut, a long document is read in overlapping windows")


class QueryTooLong(InputTooLong):
    """A query so long that no document token fits beside it in one sequence (more than the task takes)."""

    def __init__(self, num_tokens: int, max_length: int):
        self.num_tokens = num_tokens
        self.max_length = max_length
        longest = max_length - SPECIAL_TOKENS_PER_SEQUENCE - 1
        ValueError.__init__(self, f"query is {num_tokens} tokens long; the model reads {max_length} tokens per "
                                  f"sequence ([CLS] query [SEP] document [SEP]), so a query may have at most "
                                  f"{longest} tokens to leave room for the document")


@dataclass(slots=True, eq=False)
class RerankWindow:
    """One model item: `[CLS] query [SEP] document[first_token : first_token + n] [SEP]`."""

    input_ids: np.ndarray  # (T,) int64
    token_type_ids: np.ndarray  # (T,) int64
    document: int  # index of its document in the input's list
    first_token: int  # index of its first document token among the document's tokens

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(slots=True)
class RerankState:
    documents: list[str]
    truncated: list[bool]  # per document: cut to max_tokens_per_doc


def document_windows(query_ids: Sequence[int], document_ids: Sequence[int], document: int, cls_id: int,
                     sep_id: int, max_seq_length: int, overlap: int) -> list[RerankWindow]:
    """The windows of one (query, document) pair; consecutive windows share min(overlap, room // 2)
    document tokens and together they hold every document token. One window for an empty document."""
    room = max_seq_length - len(query_ids) - SPECIAL_TOKENS_PER_SEQUENCE
    if room < 1:
        raise QueryTooLong(len(query_ids), max_seq_length)
    head = np.array([cls_id, *query_ids, sep_id], dtype=np.int64)
    body = np.asarray(document_ids, dtype=np.int64)
    windows = []
    for start, stop in window_spans(len(body), room, overlap):
        input_ids = np.concatenate([head, body[start:stop], np.array([sep_id], dtype=np.int64)])
        token_type_ids = np.zeros(len(input_ids), dtype=np.int64)
        token_type_ids[len(head):] = 1
        windows.append(RerankWindow(input_ids, token_type_ids, document, start))
    return windows


def best_logits(prepared: Prepared, outputs: Sequence[dict[str, np.ndarray]]) -> np.ndarray:
    """(D,) float64: each document's logit, the best over its windows."""
    best = np.full(len(prepared.state.documents), -np.inf)
    for window, rows in zip(prepared.items, outputs):
        best[window.document] = max(best[window.document], float(rows["logits"][0]))
    return best


def json_string_bytes(text: str) -> int:
    """The most bytes `text` can take as a JSON string (UTF-8, control characters as \\u00XX escapes)."""
    escaped = sum(1 for ch in text if ch < " " or ch in "\"\\")
    return len(text.encode("utf-8", "surrogatepass")) + 5 * escaped + 2


# -- evaluation data: SQuAD-format questions over their article's paragraphs ---------------------------------


@dataclass(slots=True)
class RerankExample:
    """A query, its candidate documents and which of them are relevant (gold)."""

    id: str
    query: str
    documents: list[str] = field(repr=False)
    relevant: tuple[int, ...]
    negatives: tuple[int, ...] = ()  # candidates that do not contain an answer: training's hard negatives


def read_article_questions(path: str | Path) -> list[RerankExample]:
    """Every question of a SQuAD-format file with every distinct paragraph of its article as candidates: its
    own paragraph is the relevant one, those without its answer's text are its negatives. The questions come
    round-robin over articles and, within an article, over paragraphs, so that the first n of them (a dev
    slice) spread over every article and paragraph. Unanswerable (SQuAD v2.0) questions are left out.

    Two optional fields of a question narrow that down (both lists of paragraph indices of its article):
    `candidates`, the paragraphs it ranks (its own among them, in that order) instead of all of them, and
    `hard_negatives`, its training negatives instead of every paragraph without its answer (both as mined by
    scripts/make_samples.py)."""
    import json

    from tasks.qa import read_squad

    questions = {example.id: example for example in read_squad(path)}  # validated, with the file's place on error
    per_article = []
    for a, article in enumerate(json.loads(Path(path).read_text(encoding="utf-8"))["data"]):
        contexts = [paragraph["context"] for paragraph in article["paragraphs"]]
        every = list(dict.fromkeys(contexts))
        per_paragraph = []
        for p, paragraph in enumerate(article["paragraphs"]):
            examples = []
            for n, qa in enumerate(paragraph["qas"]):
                q = questions[qa["id"]]
                if q.is_impossible:
                    continue
                where = f"{path}: data[{a}].paragraphs[{p}].qas[{n}]"
                documents = every
                if "candidates" in qa:
                    documents = list(dict.fromkeys(contexts[i] for i in _indices(qa["candidates"], contexts, where,
                                                                                 "candidates")))
                    if q.context not in documents:
                        raise ValueError(f"{where}: 'candidates' must hold the question's own paragraph ({p})")
                position = {text: i for i, text in enumerate(documents)}
                own, answers = position[q.context], [text.lower() for text, _ in q.answers if text.strip()]
                pool = list(range(len(documents)))
                if "hard_negatives" in qa:
                    mined = _indices(qa["hard_negatives"], contexts, where, "hard_negatives")
                    pool = [position[contexts[i]] for i in mined if contexts[i] in position]
                negatives = tuple(i for i in dict.fromkeys(pool)
                                  if i != own and not any(a in documents[i].lower() for a in answers))
                examples.append(RerankExample(q.id, q.question, documents, (own,), negatives))
            per_paragraph.append(examples)
        per_article.append(_round_robin(per_paragraph))
    return _round_robin(per_article)


def _indices(value: Any, paragraphs: list[str], where: str, name: str) -> list[int]:
    """A question's list of paragraph indices, checked."""
    if not isinstance(value, list) or not all(type(i) is int and 0 <= i < len(paragraphs) for i in value):
        raise ValueError(f"{where}: '{name}' must be a list of paragraph indices of its article "
                         f"(0 to {len(paragraphs) - 1})")
    return value


def _round_robin(groups: list[list]) -> list:
    """The first of each group, then the second of each, ..."""
    return [group[rank] for rank in range(max(map(len, groups), default=0)) for group in groups if rank < len(group)]


def reciprocal_rank(ranked: Sequence[int], relevant: Sequence[int], cutoff: int = MRR_CUTOFF) -> float:
    """1 / the rank of the first relevant document among the first `cutoff`, else 0."""
    for rank, index in enumerate(ranked[:cutoff], 1):
        if index in relevant:
            return 1.0 / rank
    return 0.0


def ranking_metrics(rankings: Sequence[Sequence[int]], relevant: Sequence[Sequence[int]]) -> dict[str, float]:
    """MRR@10 and top-1 (the first document is relevant) over queries, as fractions."""
    if len(rankings) != len(relevant) or not rankings:
        raise ValueError(f"{len(rankings)} rankings for {len(relevant)} gold sets")
    mrr = sum(reciprocal_rank(r, g) for r, g in zip(rankings, relevant)) / len(rankings)
    top1 = sum(bool(r) and r[0] in g for r, g in zip(rankings, relevant)) / len(rankings)
    return {"mrr_at_10": mrr, "top1": top1, "queries": float(len(rankings))}


def mrr_standard_error(rankings: Sequence[Sequence[int]], relevant: Sequence[Sequence[int]],
                       baseline: Sequence[Sequence[int]] | None = None) -> float:
    """The standard error of MRR@10 over these queries (of the mean of their reciprocal ranks: sample standard
    deviation / sqrt(n)); with `baseline`, of the difference between the two rankers' MRR@10 on the same
    queries (paired: per query, one reciprocal rank minus the other)."""
    ranks = np.array([reciprocal_rank(r, g) for r, g in zip(rankings, relevant)])
    if baseline is not None:
        ranks = ranks - np.array([reciprocal_rank(r, g) for r, g in zip(baseline, relevant)])
    return float(ranks.std(ddof=1) / np.sqrt(len(ranks))) if len(ranks) > 1 else float("nan")


# Used by the parity gate when neither ../shared/data nor the shipped samples are there.
BUILTIN_DOCUMENTS = [
    "The Eiffel Tower was completed in 1889 as the entrance arch to the World's Fair in Paris.",
    "Mount Kilimanjaro in Tanzania is the highest mountain in Africa, 5,895 metres above sea level.",
    "The Danube flows through ten countries before it reaches the Black Sea.",
    "Marie Curie won the Nobel Prize in Chemistry in 1911 for her work on radium and polonium.",
]
BUILTIN_QUERIES = ["When was the Eiffel Tower completed?", "What is the highest mountain in Africa?",
                   "Into which sea does the Danube flow?", "Who discovered radium?"]
PARITY_DOCUMENTS = 8  # candidates per parity input (a question's own paragraph among them)


class RerankTask(TaskDefinition):
    """A query and documents -> the documents ranked by a cross-encoder's relevance; MRR@10 and top-1."""

    name = "rerank"
    head_class = "BertForSequenceClassification"
    training_adapter = "RerankAdapter"
    pools = True
    output_names = ("logits",)  # (B, 1): one relevance logit per (query, document window)
    endpoints = (Endpoint(
        "/v1/rerank", "rerank", "Rerank documents for a query (Cohere v2 / Jina shape)",
        "Cohere's v2 `{id, results: [{index, relevance_score, document?}], meta}` with Jina's `model` and "
        "`usage`;\n"
        "each result also says whether its document was `truncated` (cut to max_tokens_per_doc). The "
        "documents most\n"
        "relevant first; `top_n` the first n (more than the documents: all of them). A long document is "
        "read in\n"
        "overlapping windows and scored by its best one. Also served at /v2/rerank, the path of Cohere's v2 "
        "client.",
        request="RerankRequest", response="RerankResponse", kind="ranking",
        fields=(InputField("query", description="the search query"),
                InputField("documents", many=True,
                           description=f"1 to {MAX_DOCUMENTS:,} texts (or {{\"text\"}} objects) "
                           "ranked against the query; a long one is read in overlapping windows and scored "
                           "by its best "
                           "window")),
        examples=({"model": "ranker", "query": "What is the capital of the United States?", "top_n": 2,
                   "documents": ["Carson City is the capital city of the American state of Nevada.",
                                 "Washington, D.C. is the capital of the United States.",
                                 "Capital gains are profits from the sale of an asset."]},
                  {"query": "Which city has the tallest tower?", "return_documents": True,
                   "documents": [{"text": "Dubai's Burj Khalifa is 828 metres tall."},
                                 "Paris has the Eiffel Tower."]}),
        also_at=("/v2/rerank",), max_texts=MAX_DOCUMENTS,
    ),)
    options = RerankOptions
    pipeline_tasks = ("text-ranking",)
    input_fields = ("query", "documents")
    data_format = "squad"
    parity_examples = 32  # inputs of 8 documents: ~500 model inputs
    metric_examples = 40  # questions; each ranks every paragraph of its article (29-43 on average)
    agreement = "same most relevant document"
    parity_files = ("squad/v1.1/dev-v1.1.json", "squad/dev.json")

    def head_overrides(self, spec) -> dict[str, Any]:
        """One relevance logit; multi_label_classification (a sigmoid per document) when trained pointwise."""
        return {"num_labels": 1, "problem_type": spec.problem_type}

    def input_refusal(self, raw) -> tuple[str, str] | None:
        return ("documents", "no documents") if not raw.documents else None

    def texts(self, raw: Any) -> list[tuple[str, str]]:
        return [("query", raw.query)] + [(f"documents[{i}]", d) for i, d in enumerate(raw.documents)]

    def prepare_many(self, tokenizer: Tokenizer, spec: Any, inputs: Sequence[Any], options: Any) -> list[Prepared]:
        cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
        distinct = list(dict.fromkeys(text for raw in inputs for text in (raw.query, *raw.documents)))
        encode_batch = ids_batch_encoder(tokenizer)  # only the ids are read
        encoded = dict(zip(distinct, encode_batch(distinct, add_special_tokens=False))) if distinct else {}
        cut = options.max_tokens_per_doc
        prepared = []
        for index, raw in enumerate(inputs):
            query_ids = encoded[raw.query].ids
            if len(query_ids) + SPECIAL_TOKENS_PER_SEQUENCE >= spec.max_seq_length:
                raise InputFailed(index, QueryTooLong(len(query_ids), spec.max_seq_length))
            items, truncated = [], []
            for number, document in enumerate(raw.documents):
                ids = encoded[document].ids
                truncated.append(cut is not None and len(ids) > cut)
                items += document_windows(query_ids, ids[:cut] if truncated[-1] else ids, number, cls_id, sep_id,
                                          spec.max_seq_length, spec.doc_stride)
            prepared.append(Prepared(items, RerankState(list(raw.documents), truncated), any(truncated)))
        return prepared

    def keep(self, tokenizer, spec, options) -> Keep:
        return Keep(("logits",))

    def response_bytes(self, spec, prepared, options) -> int:
        documents = prepared.state.documents
        shown = len(documents) if options.top_n is None else min(options.top_n, len(documents))
        size = 80 * shown + 64
        if options.return_documents:
            longest = sorted((json_string_bytes(d) for d in documents), reverse=True)[:shown]
            size += sum(longest) + 24 * shown
        return size

    def decode(self, tokenizer, spec, prepared, outputs, options) -> list[Any]:
        results = []
        for p, out in zip(prepared, outputs):
            logits = best_logits(p, out)
            scores = sigmoid(logits)
            order = np.argsort(-logits, kind="stable")  # by logit: the sigmoid saturates to 1.0 where logits differ
            if options.top_n is not None:
                order = order[: options.top_n]
            ranked = []
            for i in order.tolist():
                entry = {"index": i, "relevance_score": float(scores[i]), "truncated": p.state.truncated[i]}
                if options.return_documents:
                    entry["document"] = {"text": p.state.documents[i]}
                ranked.append(entry)
            results.append(ranked)
        return results

    def row_layout(self, spec, options) -> RowLayout:
        """`results`: the ranked documents as the route's (with `return_documents` their text too)."""
        ranked = columns(("index", "int64"), ("relevance_score", "float64"), ("truncated", "bool"))
        if options.return_documents:
            ranked += columns(("document", StructOf(columns(("text", "string")))))
        return RowLayout(columns(("results", ListOf(StructOf(ranked)))), lambda r: {"results": r})

    # -- evaluation and the parity gate ---------------------------------------------------------------------

    def served_input(self, example: Any) -> Any:
        return RerankInput(query=example.query, documents=example.documents)

    def score(self, spec, examples, results) -> tuple[dict[str, float], dict]:
        return ranking_metrics([[entry["index"] for entry in ranked] for ranked in results],
                               [example.relevant for example in examples]), {}

    def headline_metric(self, metrics: dict[str, float]) -> tuple[str, float]:
        return "mrr_at_10", 100.0

    def parity_answer(self, tokenizer, spec, prepared, outputs) -> Hashable:
        return int(np.argmax(best_logits(prepared, outputs)))

    def confidence(self, spec, prepared, outputs) -> float:
        """Top-1 minus runner-up of the softmax over the documents' best logits (the listwise view)."""
        logits = best_logits(prepared, outputs)
        return 1.0 if len(logits) < 2 else float(margin(logits))

    def parity_inputs(self, path: Path | None, size: int) -> list[Any]:
        if path is None:
            return [RerankInput(query=q, documents=BUILTIN_DOCUMENTS) for q in BUILTIN_QUERIES][:size]
        examples = read_article_questions(path)
        rng = random.Random(0)
        picked = []
        for example in examples[:: max(1, len(examples) // size)][:size]:
            own = example.documents[example.relevant[0]]
            others = [d for d in example.documents if d != own]
            documents = rng.sample(others, min(len(others), PARITY_DOCUMENTS - 1)) + [own]
            rng.shuffle(documents)
            picked.append(RerankInput(query=example.query, documents=documents))
        return picked


DEFINITIONS = (RerankTask(),)
