"""What the service should answer, computed without any of berth's own encoding or decoding code:
transformers on the same fine-tuned folder (its pipelines for classification and NER; for QA, whose
pipeline transformers 5 removed, its model's logits and a brute-force span search written here)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

MAX_SEQ_LENGTH = {"sentiment": 64, "similarity": 64, "entities": 64, "reader": 128}  # models_for_tests.py


@cache
def _pipeline(task: str, folder: Path, **options):
    from transformers import pipeline

    torch.set_num_threads(2)
    warnings.filterwarnings("ignore")
    return pipeline(task, model=str(folder), device="cpu", **options)


def classify(folder: Path, texts: list[str], pairs: list[str] | None = None, top_k: int | None = None) -> list:
    """{label, score} per input (the ranked list with top_k); regression (one output): {score} = the logit."""
    regression = folder.name == "similarity"
    classifier = _pipeline("text-classification", folder, top_k=None,
                           function_to_apply="none" if regression else "softmax")
    inputs = texts if pairs is None else [{"text": t, "text_pair": p} for t, p in zip(texts, pairs)]
    out = classifier(inputs, truncation=True, max_length=MAX_SEQ_LENGTH[folder.name])
    results = []
    for ranked in out:
        ranked = ranked if isinstance(ranked, list) else [ranked]
        if regression:
            results.append({"score": ranked[0]["score"]})
        elif top_k is None:
            results.append({"label": ranked[0]["label"], "score": ranked[0]["score"]})
        else:
            results.append([{"label": r["label"], "score": r["score"]} for r in ranked[:top_k]])
    return results


def entities(folder: Path, text: str, aggregation: str = "simple") -> list[dict]:
    """{entity, start, end} per entity, as transformers' TokenClassificationPipeline finds them."""
    tagger = _pipeline("token-classification", folder, aggregation_strategy=aggregation)
    found = tagger(text)
    return [{"entity": e.get("entity_group", e.get("entity")), "start": e["start"], "end": e["end"]} for e in found]


@dataclass
class Answer:
    answer: str
    start: int
    end: int


def answers(folder: Path, question: str, context: str, top_k: int = 1, max_answer_length: int = 30) -> list[Answer]:
    """The best spans of a context that fits one window: every (start, end) pair of context tokens, end >=
    start, at most max_answer_length tokens, scored start_logit + end_logit; distinct character spans."""
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForQuestionAnswering.from_pretrained(str(folder)).eval()
    encoded = tokenizer(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets = encoded.pop("offset_mapping")[0].tolist()
    sequence_ids = encoded.sequence_ids(0)
    assert len(sequence_ids) <= MAX_SEQ_LENGTH[folder.name], "the reference handles one-window contexts only"
    with torch.no_grad():
        out = model(**encoded)
    start, end = out.start_logits[0].tolist(), out.end_logits[0].tolist()
    positions = [i for i, s in enumerate(sequence_ids) if s == 1]
    scored = {}
    for i in positions:
        for j in positions:
            if i <= j < i + max_answer_length:
                span = (offsets[i][0], offsets[j][1])
                scored[span] = max(scored.get(span, float("-inf")), start[i] + end[j])
    ranked = sorted(scored, key=lambda span: -scored[span])[:top_k]
    return [Answer(context[s:e], s, e) for s, e in ranked]


def answer_over_windows(folder: Path, question: str, context: str, max_seq_length: int,
                        overlap: int, max_answer_length: int = 30) -> tuple[Answer, int]:
    """The best span over all of transformers' doc-stride windows of a long context (its tokenizer with
    truncation="only_second" and stride = the overlap, as its old QA pipeline did), each window's spans
    scored start_logit + end_logit as `answers` does; and the number of windows."""
    tokenizer, model = _qa_model(folder)
    encoded = tokenizer(question, context, truncation="only_second", max_length=max_seq_length, stride=overlap,
                        return_overflowing_tokens=True, return_offsets_mapping=True, padding=True,
                        return_tensors="pt")
    offsets = encoded.pop("offset_mapping").tolist()
    encoded.pop("overflow_to_sample_mapping", None)
    with torch.no_grad():
        out = model(**encoded)
    best, best_score = None, float("-inf")
    for w in range(len(offsets)):
        sequence_ids = encoded.sequence_ids(w)
        start, end = out.start_logits[w].tolist(), out.end_logits[w].tolist()
        positions = [i for i, s in enumerate(sequence_ids) if s == 1]
        for i in positions:
            for j in positions:
                if i <= j < i + max_answer_length and start[i] + end[j] > best_score:
                    best_score, best = start[i] + end[j], (offsets[w][i][0], offsets[w][j][1])
    return Answer(context[best[0]:best[1]], best[0], best[1]), len(offsets)


@cache
def _qa_model(folder: Path):
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder)), AutoModelForQuestionAnswering.from_pretrained(str(folder)).eval()
