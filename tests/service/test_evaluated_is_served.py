"""What is evaluated is what is served: the metric `berth evaluate` reports for a bundle equals the metric
computed here, with this file's own metric code, from the LIVE service's answers on the same dev slice;
and the service's answers on real dev slices agree with transformers on the same fine-tuned folder."""

from __future__ import annotations

import json
import re
import string
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest

from tasks.ner import ner_windows
from tests.service import reference
from tests.service.conftest import API_KEY
from tests.tasks.test_ner import pipeline_spans_trimmed
from training.finetuning.evaluate import evaluate_model

NER_SENTENCES = 40
QA_QUESTIONS = 24
CLASSIFY_TEXTS = 40


@pytest.fixture(scope="module")
def conll_dev(shared_data):
    from tasks.readers import read_conll

    return read_conll(shared_data / "conll2003/iob2/valid.txt")[:NER_SENTENCES]


@pytest.fixture(scope="module")
def squad_dev(shared_data):
    from tasks.qa import read_squad

    return read_squad(shared_data / "squad/v1.1/dev-v1.1.json")[:QA_QUESTIONS]


def post(client: httpx.Client, route: str, body: dict) -> list:
    response = client.post(route, json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 200, response.text
    return response.json()["results"]


# -- the metrics, written here from their definitions (conlleval's exact chunk match, the SQuAD script) ----------


def gold_chunks(tags: list[str]) -> set[tuple[str, int, int]]:
    """(type, first word, last word) of each IOB2 chunk."""
    chunks, open_chunk = set(), None
    for i, tag in enumerate(tags + ["O"]):
        if open_chunk and not (tag.startswith("I-") and tag[2:] == open_chunk[0]):
            chunks.add((open_chunk[0], open_chunk[1], i - 1))
            open_chunk = None
        if tag.startswith("B-") or (tag.startswith("I-") and open_chunk is None):
            open_chunk = (tag[2:], i)
    return chunks


def predicted_chunks(words: list[str], entities: list[dict]) -> set[tuple[str, int, int]]:
    """A served entity covers every word its character span overlaps (words joined by single spaces)."""
    starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
    ends = starts + np.array([len(w) for w in words])
    chunks, taken = set(), set()
    for e in entities:
        inside = [i for i in range(len(words)) if starts[i] < e["end"] and ends[i] > e["start"] and i not in taken]
        if inside:
            chunks.add((e["entity"], inside[0], inside[-1]))
            taken.update(inside)
    return chunks


def entity_f1(gold: list[set], predicted: list[set]) -> tuple[float, float, float, int]:
    correct = sum(len(g & p) for g, p in zip(gold, predicted))
    found, wanted = sum(map(len, predicted)), sum(map(len, gold))
    precision = correct / found if found else 0.0
    recall = correct / wanted if wanted else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1, found


def squad_normalize(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def squad_scores(prediction: str, answers: list[str]) -> tuple[float, float]:
    def f1(gold: str) -> float:
        p, g = squad_normalize(prediction).split(), squad_normalize(gold).split()
        common = sum((Counter(p) & Counter(g)).values())
        if common == 0:
            return 0.0
        precision, recall = common / len(p), common / len(g)
        return 2 * precision * recall / (precision + recall)

    exact = max(float(squad_normalize(prediction) == squad_normalize(a)) for a in answers)
    return exact, max(f1(a) for a in answers)


# -- berth evaluate on a bundle == the metric of the live service's answers ------------------------------------


def test_ner_entity_f1_of_evaluate_equals_the_live_service(client, bundle_repository, shared_data, conll_dev):
    found = post(client, "/v1/ner", {"model": "entities", "inputs": [" ".join(e.tokens) for e in conll_dev]})
    served = entity_f1([gold_chunks(e.tags) for e in conll_dev],
                       [predicted_chunks(e.tokens, entities) for e, entities in zip(conll_dev, found)])
    assert served[3] > 0, "the service found no entity: the comparison would prove little"
    evaluated = evaluate_model(bundle_repository / "entities", shared_data / "conll2003/iob2/valid.txt",
                               limit=NER_SENTENCES)
    assert (evaluated["precision"], evaluated["recall"], evaluated["f1"]) == pytest.approx(served[:3], abs=1e-9)


def test_evaluate_of_a_bundle_imports_no_torch(bundle_repository):
    """`berth evaluate` of a bundle runs on ONNX Runtime through the task layer's runner: torch is never imported."""
    samples = Path(__file__).resolve().parents[2] / "data/samples/entities/dev.conll"
    code = ("import sys; from berth.cli import main; "
            f"assert main(['evaluate', {str(bundle_repository / 'entities')!r}, {str(samples)!r}, "
            "'--max-eval-examples', '8']) == 0; "
            "assert 'torch' not in sys.modules, 'berth evaluate of a bundle imported torch'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_qa_f1_of_evaluate_equals_the_live_service(client, bundle_repository, shared_data, squad_dev):
    answers = post(client, "/v1/qa", {"model": "reader", "inputs": [{"question": e.question, "context": e.context}
                                                                    for e in squad_dev]})
    scores = [squad_scores(a["answer"], [text for text, _ in e.answers]) for a, e in zip(answers, squad_dev)]
    exact, f1 = (100 * float(np.mean(column)) for column in zip(*scores))
    evaluated = evaluate_model(bundle_repository / "reader", shared_data / "squad/v1.1/dev-v1.1.json",
                               limit=QA_QUESTIONS)
    assert (evaluated["exact"], evaluated["f1"]) == pytest.approx((exact, f1), abs=1e-9)


def test_classification_accuracy_of_evaluate_equals_the_live_service(client, bundle_repository, shared_data,
                                                                      tmp_path):
    from tasks.readers import read_sst2

    # The SST-2 dev slice, its labels named as the test bundle names them.
    rows = read_sst2(shared_data / "sst2/dev.tsv")[:CLASSIFY_TEXTS]
    names = {"0": "negative", "1": "positive"}
    dev = tmp_path / "sst2-dev.jsonl"
    dev.write_text("".join(json.dumps({"text": r.text, "label": names[str(r.label)]}) + "\n" for r in rows))
    results = post(client, "/v1/classify", {"model": "sentiment", "inputs": [r.text for r in rows]})
    accuracy = float(np.mean([res["label"] == names[str(r.label)] for res, r in zip(results, rows)]))
    evaluated = evaluate_model(bundle_repository / "sentiment", dev, limit=CLASSIFY_TEXTS)
    assert evaluated["accuracy"] == pytest.approx(accuracy, abs=1e-9)


def test_pair_pearson_of_evaluate_equals_the_live_service(client, bundle_repository, shared_data):
    from tasks.readers import read_glue

    path = shared_data / "stsb/dev.tsv"
    rows = read_glue(path, "stsb")[:CLASSIFY_TEXTS]
    results = post(client, "/v1/pair", {"model": "similarity", "inputs": [{"text": r.text, "text_pair": r.text_pair}
                                                                          for r in rows]})
    pearson = float(np.corrcoef([r["score"] for r in results], [float(r.label) for r in rows])[0, 1])
    evaluated = evaluate_model(bundle_repository / "similarity", path, limit=CLASSIFY_TEXTS)
    assert evaluated["pearson"] == pytest.approx(pearson, abs=1e-6)


# -- the service against transformers on real dev slices ---------------------------------------------------------


@pytest.mark.parametrize("aggregation", ["none", "simple", "first", "average", "max"])
def test_ner_on_conll_dev_matches_the_transformers_pipeline(client, checkpoints, conll_dev, tokenizer, aggregation):
    # Sentences that fit one window of the entities model (64 tokens): the pipeline reads a text in one pass.
    texts = [t for t in (" ".join(e.tokens) for e in conll_dev) if len(tokenizer.encode(t).ids) <= 64][:20]
    assert len(texts) == 20
    found = post(client, "/v1/ner", {"model": "entities", "inputs": texts, "aggregation": aggregation})
    for text, got in zip(texts, found):
        # simple's word rule: its spans are the pipeline's `first` spans (the pipeline's simple may cut a word)
        spans_of = "first" if aggregation == "simple" else aggregation
        want = [(e["entity"], e["start"], e["end"], None) for e in reference.entities(checkpoints["entities"], text,
                                                                                      spans_of)]
        if aggregation != "none":  # tasks.ner's documented edge rule: the pipeline may return "all-"
            want = pipeline_spans_trimmed(text, ner_windows(tokenizer, text), want)
        assert [(e["entity"], e["start"], e["end"]) for e in got] == [w[:3] for w in want]


def test_classification_on_sst2_dev_matches_the_transformers_pipeline(client, checkpoints, shared_data):
    from tasks.readers import read_sst2

    texts = [r.text for r in read_sst2(shared_data / "sst2/dev.tsv")[:CLASSIFY_TEXTS]]
    got = post(client, "/v1/classify", {"model": "sentiment", "inputs": texts})
    want = reference.classify(checkpoints["sentiment"], texts)
    assert [g["label"] for g in got] == [w["label"] for w in want]
    assert [g["score"] for g in got] == pytest.approx([w["score"] for w in want], abs=1e-4)


def test_qa_on_squad_dev_matches_transformers_windows_and_an_independent_span_search(client, checkpoints, squad_dev):
    """transformers 5 has no question-answering pipeline: its tokenizer makes the doc-stride windows
    (truncation only_second, stride = the overlap), its model gives the logits, and reference.py picks the
    best span over all windows."""
    inputs = [{"question": e.question, "context": e.context} for e in squad_dev]
    got = post(client, "/v1/qa", {"model": "reader", "inputs": inputs})
    spec = json.loads((checkpoints["reader"] / "berth_task.json").read_text())
    agree, windows = 0, 0
    for item, answer in zip(inputs, got):
        want, count = reference.answer_over_windows(checkpoints["reader"], item["question"], item["context"],
                                                    spec["max_seq_length"], spec["doc_stride"])
        windows += count
        agree += (answer["start"], answer["end"]) == (want.start, want.end)
    assert windows > len(inputs), "the slice should need several windows per context"
    # The windows differ in one documented way: the service's last window ends at the context's last token
    # (full left context, as tasks.qa.window_spans says), transformers' last window is the remainder.
    assert agree >= 0.9 * len(inputs), f"{agree} of {len(inputs)} answers agree"
