"""Extractive question answering (SQuAD v1.1 / v2.0): read the data, cut a context of any length into
model windows, label windows for training, and turn start/end logits back into answers.

Used by training (features and evaluation) and by the service ({"question", "context"} inputs).
Torch-free: numpy and tokenizers only.

A window is `[CLS] question [SEP] context-slice [SEP]` (token types 0 then 1), at most
`max_seq_length` tokens. The question is cut to `max_query_length` tokens (as google-research/bert
does); the context is tokenized once, uncut, and sliced into windows.

`doc_stride` follows the Hugging Face convention (and `tasks.runtime.spec.TaskSpec`): it is the number of
context tokens two consecutive windows SHARE (the overlap), so the next window starts
`room - doc_stride` context tokens later, where room = max_seq_length - question tokens - 3.
(google-research/bert's run_squad.py calls the advance step doc_stride: its 384/128 equals an overlap
of room - 128 here.) The overlap is capped at room // 2, so that windows always advance by at least
half a window and a long question can never make the window count explode; Hugging Face raises an
error there instead. Below the cap, the windows are token for token those of a Hugging Face fast
tokenizer called with truncation="only_second", stride=doc_stride, return_overflowing_tokens=True.

Character offsets are Python str indices into the caller's original context, end exclusive.

Why one file of ~600 lines: reading, windows, training labels, answer decoding and the task definition are one
task's steps, kept together as every task module is (tasks/definition.py); its metric is already its own
(tasks/qa_metrics.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from pydantic import BaseModel, Field
from tokenizers import Tokenizer

from tasks.common import OFFSETS_NOTE, Refusal, TooLarge
from tasks.definition import (
    Endpoint,
    InputField,
    ListOf,
    Prepared,
    RowLayout,
    ServingLimits,
    StructOf,
    TaskDefinition,
    columns,
)
from tasks.readers import BadRows, DataError
from tasks.runtime.graphemes import extend_end
from tasks.runtime.tokenizer import CLS, SEP

# ---------------------------------------------------------------------------------------------
# Reading SQuAD files


@dataclass(slots=True)
class QAExample:
    """One question about one context. `answers` holds (text, answer_start) with answer_start a
    character index into `context`; it is empty exactly when `is_impossible` (SQuAD v2.0)."""

    id: str
    title: str
    question: str
    context: str = field(repr=False)
    answers: list[tuple[str, int]] = field(default_factory=list)
    is_impossible: bool = False


def read_squad(path: str | Path, bad_rows: BadRows | None = None) -> list[QAExample]:
    """Every question of a SQuAD v1.1 or v2.0 JSON file, in file order.

    Raises DataError (a ValueError) naming the file, the line and the place (e.g. `data[3].paragraphs[0].qas[7]`)
    when the file is not UTF-8 JSON or not shaped like SQuAD: missing fields, wrong types, an answer_start outside
    its context, duplicate ids, an answerable question without answers or an unanswerable one with. With
    `BadRows("skip")` a bad question is a bad row, kept there, and the reading goes on.
    """
    bad = bad_rows if bad_rows is not None else BadRows()
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(path, 0, f"cannot read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        column = e.start - data.rfind(b"\n", 0, e.start)
        raise DataError(path, line, f"bytes that are not UTF-8 (0x{data[e.start]:02x} at character {column}); "
                                    "save the file as UTF-8") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(path, e.lineno, f"invalid JSON: {e.msg} (character {e.colno})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), list):
        raise DataError(path, 0, "not a SQuAD file: expected a JSON object with a 'data' list")
    examples: list[QAExample] = []
    seen: set[str] = set()
    for a, article in enumerate(raw["data"]):
        where = f"data[{a}]"
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise DataError(path, 0, f"{where}: expected an object with a 'paragraphs' list")
        title = article.get("title", "")
        if not isinstance(title, str):
            raise DataError(path, 0, f"{where}: 'title' must be a string")
        for p, paragraph in enumerate(article["paragraphs"]):
            where = f"data[{a}].paragraphs[{p}]"
            if not (
                isinstance(paragraph, dict)
                and isinstance(paragraph.get("context"), str)
                and isinstance(paragraph.get("qas"), list)
            ):
                raise DataError(path, 0, f"{where}: expected an object with a 'context' string and a 'qas' list")
            for q, qa in enumerate(paragraph["qas"]):
                try:
                    example = _parse_question(qa, title, paragraph["context"])
                    if example.id in seen:
                        raise ValueError(f"duplicate question id {example.id!r}")
                except ValueError as e:
                    bad.handle(DataError(path, _line_of_question(text, qa), f"{where}.qas[{q}]: {e}"))
                    continue
                seen.add(example.id)
                examples.append(example)
    if not examples and not bad.found:
        raise DataError(path, 0, "no questions found")
    return examples


def _line_of_question(text: str, qa: Any) -> int:
    """The line of the file where question `qa` (an object of its 'qas' list) gives its id or, without one, its
    question; 0 when neither can be found."""
    for key in ("id", "question"):
        value = qa.get(key) if isinstance(qa, dict) else None
        if isinstance(value, str) and value:
            found = re.search(rf'"{key}"\s*:\s*{re.escape(json.dumps(value))}', text)
            if found is None:  # the file escapes characters json.dumps keeps, or the other way round
                found = re.search(rf'"{key}"\s*:\s*{re.escape(json.dumps(value, ensure_ascii=False))}', text)
            if found is not None:
                return text.count("\n", 0, found.start()) + 1
    return 0


def _parse_question(qa: Any, title: str, context: str) -> QAExample:
    if not isinstance(qa, dict):
        raise ValueError("expected a question object")
    qid, question, answers = qa.get("id"), qa.get("question"), qa.get("answers")
    is_impossible = qa.get("is_impossible", False)
    if not isinstance(qid, str) or not qid:
        raise ValueError("'id' must be a non-empty string")
    if not isinstance(question, str):
        raise ValueError(f"question {qid!r}: 'question' must be a string")
    if not isinstance(answers, list):
        raise ValueError(f"question {qid!r}: 'answers' must be a list")
    if not isinstance(is_impossible, bool):
        raise ValueError(f"question {qid!r}: 'is_impossible' must be true or false")
    parsed: list[tuple[str, int]] = []
    for i, answer in enumerate(answers):
        text = answer.get("text") if isinstance(answer, dict) else None
        start = answer.get("answer_start") if isinstance(answer, dict) else None
        if not isinstance(text, str) or not isinstance(start, int) or isinstance(start, bool):
            raise ValueError(
                f"question {qid!r}: answers[{i}] needs a 'text' string and an 'answer_start' integer"
            )
        if start < 0 or start + len(text) > len(context):
            raise ValueError(
                f"question {qid!r}: answers[{i}] spans characters {start}..{start + len(text)}, "
                f"outside its context of {len(context)} characters"
            )
        parsed.append((text, start))
    if is_impossible and parsed:
        raise ValueError(f"question {qid!r}: marked is_impossible but has answers")
    if not is_impossible and not parsed:
        raise ValueError(f"question {qid!r}: no answers and not marked is_impossible")
    return QAExample(qid, title, question, context, parsed, is_impossible)


# ---------------------------------------------------------------------------------------------
# Windows (model features)


@dataclass(slots=True, eq=False)
class QAWindow:
    """One model input `[CLS] question [SEP] context[a:b] [SEP]` of a question and its context.

    Token positions count from [CLS] = 0. The context tokens are at positions
    `context_start .. context_end - 1` (none when the context is empty); `offsets[i]` is the
    (start, end) character span in `context` of the token at position i, (0, 0) for question and
    special tokens. Has `input_ids`, `token_type_ids` and `len()`, like `EncodedInput`, so
    `tasks.runtime.batching.pad_batch` pads it.
    """

    input_ids: np.ndarray  # (T,) int64
    token_type_ids: np.ndarray  # (T,) int64: 0 for [CLS] question [SEP], 1 for context and the last [SEP]
    offsets: np.ndarray = field(repr=False)  # (T, 2) int64 character spans in `context`
    context_start: int  # position of the first context token (= question tokens + 2)
    context_end: int  # position after the last context token (= position of the final [SEP])
    first_context_token: int  # index of this window's first context token among all context tokens
    window_index: int  # 0, 1, ... among the windows of one (question, context)
    question_truncated: bool  # the question had more than max_query_length tokens
    context: str = field(repr=False)  # the caller's original context (shared, not copied)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def is_context(self) -> np.ndarray:
        """(T,) bool: which positions hold context tokens (the only ones an answer may use)."""
        mask = np.zeros(len(self.input_ids), dtype=bool)
        mask[self.context_start : self.context_end] = True
        return mask


def window_spans(n_tokens: int, room: int, doc_stride: int) -> list[tuple[int, int]]:
    """[start, stop) ranges over `n_tokens` context tokens, each at most `room` long, consecutive
    ranges sharing min(doc_stride, room // 2) tokens; the last one ends at n_tokens. One (0, 0)
    range when there are no tokens."""
    if room < 1:
        raise ValueError(f"a window needs room for at least one context token (room={room})")
    if doc_stride < 0:
        raise ValueError(f"doc_stride must be >= 0, got {doc_stride}")
    advance = room - min(doc_stride, room // 2)
    n_windows = 1 + max(0, -(-(n_tokens - room) // advance))  # ceil division
    starts = np.arange(n_windows) * advance
    return [(int(s), int(min(s + room, n_tokens))) for s in starts]


def make_windows(
    tokenizer: Tokenizer,
    question: str,
    context: str,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
) -> list[QAWindow]:
    """All windows of a (question, context) pair; see the module docstring for the layout and stride.

    The tokenizer must have no truncation or padding configured (`tasks.runtime.tokenizer.load_tokenizer`
    switches them off): either would silently drop context.
    """
    if max_query_length < 0:
        raise ValueError(f"max_query_length must be >= 0, got {max_query_length}")
    if max_seq_length - max_query_length - 3 < 1:
        raise ValueError(
            f"max_seq_length={max_seq_length} leaves no room for context after a question of "
            f"max_query_length={max_query_length} tokens and 3 special tokens"
        )
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        raise ValueError(
            "the tokenizer has truncation or padding configured; use tasks.runtime.tokenizer.plain_tokenizer"
        )
    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
    question_ids = tokenizer.encode(question, add_special_tokens=False).ids
    question_truncated = len(question_ids) > max_query_length
    head = np.array([cls_id, *question_ids[:max_query_length], sep_id], dtype=np.int64)
    encoded = tokenizer.encode(context, add_special_tokens=False)
    context_ids = np.asarray(encoded.ids, dtype=np.int64)
    context_offsets = np.asarray(encoded.offsets, dtype=np.int64).reshape(-1, 2)

    room = max_seq_length - len(head) - 1
    windows = []
    for index, (start, stop) in enumerate(window_spans(len(context_ids), room, doc_stride)):
        ctx_start, ctx_end = len(head), len(head) + stop - start
        input_ids = np.concatenate([head, context_ids[start:stop], [sep_id]])
        token_type_ids = np.zeros(len(input_ids), dtype=np.int64)
        token_type_ids[ctx_start:] = 1
        offsets = np.zeros((len(input_ids), 2), dtype=np.int64)
        offsets[ctx_start:ctx_end] = context_offsets[start:stop]
        windows.append(
            QAWindow(
                input_ids,
                token_type_ids,
                offsets,
                ctx_start,
                ctx_end,
                first_context_token=start,
                window_index=index,
                question_truncated=question_truncated,
                context=context,
            )
        )
    return windows


def question_too_long(spec: Any, prepared: Any) -> str | None:
    """Why a prepared question cannot be answered as asked: it had more tokens than the model reads, so its
    windows hold it cut (training and evaluation cut it as BERT's recipe does; serving refuses). None: it fits."""
    if prepared.items and prepared.items[0].question_truncated:
        limit = spec.max_query_length
        return f"more than {limit} tokens; this model reads questions of at most {limit} tokens (its max_query_length)"
    return None


def label_window(window: QAWindow, answer_start_char: int | None, answer_text: str | None) -> tuple[int, int]:
    """Training targets (start position, end position) of an answer in a window.

    The answer is the characters [answer_start_char, answer_start_char + len(answer_text)) of the
    context, less any surrounding whitespace; the targets are the first and last context tokens that
    overlap it. An unanswerable question (None or empty answer) and an answer not wholly inside this
    window both give (0, 0), the [CLS] position, as in BERT's SQuAD v2.0 recipe.
    """
    if answer_start_char is None or not answer_text or not answer_text.strip():
        return 0, 0
    start_char = answer_start_char + len(answer_text) - len(answer_text.lstrip())
    end_char = answer_start_char + len(answer_text.rstrip())
    spans = window.offsets[window.context_start : window.context_end]  # (n_ctx, 2)
    if len(spans) == 0 or start_char < spans[0, 0] or end_char > spans[-1, 1]:
        return 0, 0
    first = int(np.searchsorted(spans[:, 1], start_char, side="right"))  # first token ending after start
    last = int(np.searchsorted(spans[:, 0], end_char, side="left")) - 1  # last token starting before end
    if first > last:
        return 0, 0
    return window.context_start + first, window.context_start + last


# ---------------------------------------------------------------------------------------------
# Decoding logits into answers


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer: `context[start:end] == answer` (character offsets into the original context).

    `score` is a probability: the softmax over the logit sums start+end of the candidate spans
    considered (the n_best_size best distinct spans over all windows, plus the null answer when
    handle_impossible), as in google-research/bert's n-best probabilities. The null answer is
    ("", 0, 0, is_impossible=True). `null_score_diff` belongs to the whole question: null score
    minus best span score, in logits (> threshold means "no answer"; +inf when the context offers
    no span), the number evaluation searches the best threshold over.
    """

    answer: str
    start: int
    end: int
    score: float
    is_impossible: bool = False
    null_score_diff: float | None = None


def decode_answers(
    windows: Sequence[QAWindow],
    start_logits: Sequence[np.ndarray] | np.ndarray,
    end_logits: Sequence[np.ndarray] | np.ndarray,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    top_k: int = 1,
    handle_impossible: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> list[Answer]:
    """The `top_k` best answers to one question, over ALL of its windows, best first.

    `start_logits[i]` / `end_logits[i]` are window i's logits (a (W, T) padded batch or W arrays,
    at least len(windows[i]) long; padding beyond is ignored). A span lies in the context tokens of
    one window, ends at or after its start and is at most `max_answer_length` tokens long; its score
    is start_logit + end_logit. The same character span found in several overlapping windows counts
    once, with its best score.

    SQuAD v2.0 (google's rule): the null score is the minimum over windows of start[CLS] + end[CLS];
    with `handle_impossible`, the answer is null when null score - best span score >
    `null_score_diff_threshold`, and the null answer is also ranked among the others. When no span
    exists at all (empty context), the only answer is null, whatever `handle_impossible` says.
    """
    if not windows:
        raise ValueError("decode_answers needs at least one window")
    if min(n_best_size, max_answer_length, top_k) < 1:
        raise ValueError("n_best_size, max_answer_length and top_k must be >= 1")
    context = windows[0].context
    if any(w.context != context for w in windows):
        raise ValueError("all windows must come from the same context (one question at a time)")
    start, start_cls = _context_logits(windows, start_logits, "start_logits")  # (W, T), (W,)
    end, end_cls = _context_logits(windows, end_logits, "end_logits")
    offsets = _padded_offsets(windows, start.shape[1])  # (W, T, 2)

    spans, span_scores = _best_spans(start, end, offsets, n_best_size, max_answer_length)
    null_score = float(np.min(start_cls + end_cls))
    null_score_diff = null_score - span_scores[0] if spans else float("inf")
    with_null = handle_impossible or not spans
    logits = np.array(span_scores + ([null_score] if with_null else []))
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()

    answers = [
        Answer(context[s:e], s, e, float(p), False, null_score_diff)
        for (s, e), p in zip(spans, probs[: len(spans)])
    ]
    if with_null:
        null = Answer("", 0, 0, float(probs[-1]), True, null_score_diff)
        if not spans or null_score_diff > null_score_diff_threshold:
            rank = 0
        else:  # ranked by score, but never above the best span the threshold rule preferred
            rank = max(1, sum(score > null_score for score in span_scores))
        answers.insert(rank, null)
    return answers[:top_k]


def _context_logits(
    windows: Sequence[QAWindow], logits: Sequence[np.ndarray] | np.ndarray, name: str
) -> tuple[np.ndarray, np.ndarray]:
    """(W, T) float64 logits with -inf outside each window's context tokens, and the (W,) [CLS] logits."""
    if len(logits) != len(windows):
        raise ValueError(f"{name}: {len(logits)} rows for {len(windows)} windows")
    width = max(len(w) for w in windows)
    masked = np.full((len(windows), width), -np.inf)
    cls = np.empty(len(windows))
    for i, (window, row) in enumerate(zip(windows, logits)):
        row = np.asarray(row, dtype=np.float64)
        if row.ndim != 1 or len(row) < len(window):
            raise ValueError(
                f"{name}[{i}]: expected a 1-D array of at least {len(window)} logits, got shape {row.shape}"
            )
        masked[i, window.context_start : window.context_end] = row[window.context_start : window.context_end]
        cls[i] = row[0]
    return masked, cls


def _padded_offsets(windows: Sequence[QAWindow], width: int) -> np.ndarray:
    offsets = np.zeros((len(windows), width, 2), dtype=np.int64)
    for i, window in enumerate(windows):
        offsets[i, : len(window)] = window.offsets
    return offsets


def _best_spans(
    start: np.ndarray, end: np.ndarray, offsets: np.ndarray, n_best_size: int, max_answer_length: int
) -> tuple[list[tuple[int, int]], list[float]]:
    """The n_best_size best distinct character spans and their scores, best first.

    Exact (google's run_squad pairs only the top-n starts with the top-n ends): every (start i, length
    k + 1) pair of a window is scored in one (T, L) band, L = min(max_answer_length, T), one window at
    a time, keeping a running top n_best_size. Memory is one window's band, never windows x T x L.
    """
    n_windows, width = start.shape
    length = max(1, min(max_answer_length, width))
    best: dict[tuple[int, int], float] = {}  # the running top: span -> its best score
    for w in range(n_windows):
        padded_end = np.concatenate([end[w], np.full(length - 1, -np.inf)])
        band = sliding_window_view(padded_end, length)[:width]  # (T, L): end[w, i + k]
        scores = start[w, :, None] + band  # (T, L); -inf unless both ends are context tokens
        flat = scores.ravel()
        m = min(n_best_size, int(np.count_nonzero(np.isfinite(flat))))
        if m == 0:
            continue
        top = np.argpartition(flat, len(flat) - m)[len(flat) - m :]
        i, k = np.unravel_index(top, scores.shape)
        for s, e, score in zip(offsets[w, i, 0].tolist(), offsets[w, i + k, 1].tolist(), flat[top].tolist()):
            if score > best.get((s, e), -np.inf):
                best[(s, e)] = score
        if len(best) > n_best_size:
            best = dict(sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:n_best_size])
    ranked = sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:n_best_size]
    return [span for span, _ in ranked], [score for _, score in ranked]


# ---------------------------------------------------------------------------------------------
# The task definition

# Used by the parity gate when neither ../shared/data nor the shipped samples are there.
BUILTIN_CONTEXT = (
    "The Normans (Norman: Nourmands; French: Normands; Latin: Normanni) were the people who in the 10th and "
    "11th centuries gave their name to Normandy, a region in France. They were descended from Norse raiders and "
    "pirates from Denmark, Iceland and Norway who, under their leader Rollo, agreed to swear fealty to King "
    "Charles III of West Francia. Through generations of assimilation and mixing with the native Frankish and "
    "Roman-Gaulish populations, their descendants would gradually merge with the Carolingian-based cultures of "
    "West Francia. The distinct cultural and ethnic identity of the Normans emerged initially in the first half "
    "of the 10th century, and it continued to evolve over the succeeding centuries. "
) * 3
BUILTIN_QUESTIONS = ["In what country is Normandy located?", "Who was the Norse leader?",
                     "When were the Normans in Normandy?", "From which countries did the Norse originate?"]
N_BEST_SIZE = 20  # candidate spans kept per question (at least top_k)


class QAOptions(BaseModel):
    top_k: int = Field(1, strict=True, ge=1, le=20,
                       description="answers per question; above 1 each result is a ranked list")
    max_answer_length: int = Field(30, strict=True, ge=1, le=512, description="longest answer, in tokens; at most the "
                                                                  "server's max_answer_length_cap (default 64)")
    handle_impossible: bool | None = Field(
        None, strict=True, description="allow the empty answer (is_impossible); default: whether the model was trained "
                                       "on SQuAD v2.0")


def shape_answer(context: str, answer: Answer) -> dict[str, Any]:
    """An answer as served: its end moved past any code point that belongs to its last character."""
    end = extend_end(context, answer.end) if not answer.is_impossible else answer.end
    return {"answer": context[answer.start:end] if end != answer.end else answer.answer, "start": answer.start,
            "end": end, "score": answer.score, "is_impossible": answer.is_impossible}


class QATask(TaskDefinition):
    """A question and a context of any length -> the best answer span over all windows; SQuAD EM/F1."""

    name = "qa"
    head_class = "BertForQuestionAnswering"
    training_adapter = "QAAdapter"
    finetune_max_seq_length = 384  # a question and a window of its context
    finetune_doc_stride = 128  # context tokens two consecutive windows share
    output_names = ("start_logits", "end_logits")
    per_token = True
    endpoints = (Endpoint(
        "/v1/qa", "question_answering", "Extractive question answering over contexts of any length",
        "`{answer, start, end, score, is_impossible}` per question (a ranked list with top_k > 1), the best "
        "over "
        "all windows of the context. " + OFFSETS_NOTE,
        request="QARequest", response="QAResponse",
        inputs_description="a {question, context} object or a list of them; long contexts are read in "
                           "overlapping windows",
        input_object="QAInput", fields=(InputField("question"), InputField("context")),
        examples=({"inputs": {"question": "Where is Normandy?",
                              "context": "The Normans gave their name to Normandy, a region in France."}},),
    ),)
    answers_can_be_impossible = True
    options = QAOptions
    pipeline_tasks = ("question-answering",)
    input_fields = ("question", "context")
    data_format = "squad"
    parity_examples = 100
    metric_examples = 1000
    agreement = "same best answer span (start, end, no-answer) over all windows, per question"
    parity_files = ("squad/v1.1/dev-v1.1.json", "squad/dev.json")

    def check_options(self, options, limits: ServingLimits) -> None:
        if options.max_answer_length > limits.max_answer_length_cap:
            raise Refusal(f"{options.max_answer_length} tokens; the limit is {limits.max_answer_length_cap} "
                          "(max_answer_length_cap)", "max_answer_length")

    def check_prepared(self, spec, prepared, options, limits: ServingLimits) -> None:
        """A question longer than the model's max_query_length would be cut: refused instead, never cut
        silently."""
        for index, p in enumerate(prepared):
            if refused := self.prepared_refusal(spec, p):
                field, why = refused
                raise TooLarge(f"{why}; shorten the question", field, index)

    def prepared_refusal(self, spec, prepared) -> tuple[str, str] | None:
        """A question longer than the model reads (its windows hold it cut)."""
        too_long = question_too_long(spec, prepared)
        return ("question", too_long) if too_long else None

    def prepare(self, tokenizer, spec, raw, options) -> Prepared:
        windows = make_windows(tokenizer, raw.question, raw.context, spec.max_seq_length, spec.doc_stride,
                               spec.max_query_length)
        return Prepared(windows, windows)

    def answers(self, spec, prepared, outputs, options) -> list[list[Answer]]:
        """The ranked `Answer`s (with their null_score_diff) of each question, before shaping."""
        handle_impossible = spec.version_2_with_negative if options.handle_impossible is None \
            else options.handle_impossible
        return [decode_answers(item.state, [o["start_logits"] for o in out], [o["end_logits"] for o in out],
                               n_best_size=max(N_BEST_SIZE, options.top_k), max_answer_length=options.max_answer_length,
                               top_k=options.top_k, handle_impossible=handle_impossible,
                               null_score_diff_threshold=spec.null_score_diff_threshold)
                for item, out in zip(prepared, outputs)]

    def row_layout(self, spec, options) -> RowLayout:
        """The best answer's fields (top_k 1), else `answers`: the ranked answers."""
        answer = columns(("answer", "string"), ("start", "int64"), ("end", "int64"), ("score", "float64"),
                         ("is_impossible", "bool"))
        if options.top_k == 1:
            return RowLayout(answer, dict)
        return RowLayout(columns(("answers", ListOf(StructOf(answer)))), lambda r: {"answers": r})

    def decode(self, tokenizer, spec, prepared, outputs, options) -> list[Any]:
        results = []
        for item, answers in zip(prepared, self.answers(spec, prepared, outputs, options)):
            shaped = [shape_answer(item.state[0].context, a) for a in answers]
            results.append(shaped if options.top_k > 1 else shaped[0])
        return results

    def evaluate(self, tokenizer, spec, examples, run, options=None) -> tuple[dict[str, float], dict]:
        """Official SQuAD EM/F1 of the served best answers. A v2 model's no-answer threshold is chosen on
        these examples (the best span and its null_score_diff are what serving compares with it)."""
        from tasks import qa_metrics

        options = QAOptions(handle_impossible=False) if options is None else options
        prepared, outputs = self.run_prepared(tokenizer, spec, examples, run, options)
        best = [answers[0] for answers in self.answers(spec, prepared, outputs, options)]
        predictions = {ex.id: shape_answer(ex.context, a)["answer"] for ex, a in zip(examples, best)}
        if not spec.version_2_with_negative:
            return qa_metrics.evaluate_squad(examples, predictions), {}
        na_scores = {ex.id: a.null_score_diff if a.null_score_diff is not None else float("inf")
                     for ex, a in zip(examples, best)}
        result = qa_metrics.evaluate_squad(examples, predictions, na_scores=na_scores)
        threshold = float(result.get("best_f1_thresh", 0.0))
        # Report exact/f1 at the chosen threshold (what the saved model will do when served).
        chosen = {qid: ("" if na_scores[qid] > threshold else text) for qid, text in predictions.items()}
        at_threshold = qa_metrics.evaluate_squad(examples, chosen)
        result.update({k: v for k, v in at_threshold.items() if k != "best_exact"})
        return result, {"null_score_diff_threshold": threshold}

    def headline_metric(self, metrics: dict[str, float]) -> tuple[str, float]:
        return "f1", 1.0  # the SQuAD script reports percent

    def parity_answer(self, tokenizer, spec, prepared, outputs) -> Hashable:
        best = self.answers(spec, [prepared], [outputs], QAOptions())[0][0]
        return (best.start, best.end, best.is_impossible)

    def confidence(self, spec, prepared, outputs) -> float:  # the best span over the n-best spans of all windows
        answers = self.answers(spec, [prepared], [outputs], QAOptions(top_k=2))[0]
        return answers[0].score - (answers[1].score if len(answers) > 1 else 0.0)

    def parity_inputs(self, path: Path | None, size: int) -> list[Any]:
        if path is None:
            return [QAExample(f"builtin-{i}", "", q, BUILTIN_CONTEXT) for i, q in enumerate(BUILTIN_QUESTIONS)][:size]
        seen: set[str] = set()
        candidates = []  # one question per paragraph, in file order
        for example in read_squad(path):
            if example.context not in seen:
                seen.add(example.context)
                candidates.append(example)
        # A quarter from the longest contexts (several full windows each), the rest in file order.
        longest = sorted(candidates, key=lambda e: -len(e.context))[: max(1, size // 4)]
        chosen_ids = {e.id for e in longest}
        in_order = [e for e in candidates if e.id not in chosen_ids][: size - len(longest)]
        picked = [e for pair in zip(longest, in_order) for e in pair] \
            + longest[len(in_order):] + in_order[len(longest):]
        return picked[:size]


DEFINITIONS = (QATask(),)
