"""The rerank task layer: windows over long documents, best-window scores, cuts, ranking and its metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import orjson
import pytest

from tasks.common import InputFailed, InputTooLong
from tasks.registry import definition
from tasks.rerank import (
    QueryTooLong,
    RerankInput,
    RerankOptions,
    mrr_standard_error,
    ranking_metrics,
    read_article_questions,
)
from tasks.runtime.spec import TaskSpec

RERANK = definition("rerank")
SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples"
WORDS = ("river mountain forest castle bridge harbour village meadow island desert valley canyon glacier lake "
         "volcano prairie").split()


def _spec(max_seq_length=32, doc_stride=8) -> TaskSpec:
    return TaskSpec(task="rerank", max_seq_length=max_seq_length, doc_stride=doc_stride)


def _long_document(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] + str(i) for i in range(words))


def _logits(prepared, values) -> list[list[dict]]:
    """Model outputs for one prepared input: one logit per window, in item order."""
    return [[{"logits": np.array([v], dtype=np.float32)} for v in values]]


def test_windows_cover_every_document_token_and_stay_within_the_model(tokenizer):
    spec = _spec()
    query, document = "where is the castle?", _long_document(40)
    prepared = RERANK.prepare(tokenizer, spec, RerankInput(query=query, documents=["a short one", document]),
                              RerankOptions())
    query_ids = tokenizer.encode(query, add_special_tokens=False).ids
    document_ids = tokenizer.encode(document, add_special_tokens=False).ids
    head = [tokenizer.token_to_id("[CLS]"), *query_ids, tokenizer.token_to_id("[SEP]")]
    windows = [w for w in prepared.items if w.document == 1]
    assert len(windows) > 2 and not prepared.truncated
    covered = set()
    for window in windows:
        ids = window.input_ids.tolist()
        assert len(ids) <= spec.max_seq_length
        assert ids[: len(head)] == head and ids[-1] == tokenizer.token_to_id("[SEP]")
        body = ids[len(head):-1]
        assert body == document_ids[window.first_token : window.first_token + len(body)]
        assert window.token_type_ids.tolist() == [0] * len(head) + [1] * (len(body) + 1)
        covered.update(range(window.first_token, window.first_token + len(body)))
    assert covered == set(range(len(document_ids)))
    # consecutive windows overlap by the spec's doc_stride (8 here, below half a window)
    starts = [w.first_token for w in windows]
    room = spec.max_seq_length - len(head) - 1
    assert all(b - a == room - 8 for a, b in zip(starts, starts[1:]))


def test_best_window_scores_the_document(tokenizer):
    spec = _spec()
    raw = RerankInput(query="castle", documents=[_long_document(40), "castle bridge"])
    prepared = RERANK.prepare(tokenizer, spec, raw, RerankOptions())
    owners = [w.document for w in prepared.items]
    windows_of_first = owners.count(0)
    assert windows_of_first >= 3
    # the first document's middle window is its best (2.0); the second document scores 1.0
    values = [-3.0] * windows_of_first + [1.0]
    values[1] = 2.0
    [ranked] = RERANK.decode(tokenizer, spec, [prepared], _logits(prepared, values), RerankOptions())
    assert [entry["index"] for entry in ranked] == [0, 1]
    assert ranked[0]["relevance_score"] == pytest.approx(1 / (1 + math.exp(-2.0)))
    assert ranked[1]["relevance_score"] == pytest.approx(1 / (1 + math.exp(-1.0)))
    assert set(ranked[0]) == {"index", "relevance_score", "truncated"}


def test_max_tokens_per_doc_cuts_first_and_flags_it(tokenizer):
    spec = _spec()
    long_document, short_document = _long_document(40), "castle bridge"
    raw = RerankInput(query="castle", documents=[long_document, short_document])
    prepared = RERANK.prepare(tokenizer, spec, raw, RerankOptions(max_tokens_per_doc=5))
    assert [w.document for w in prepared.items] == [0, 1]  # the cut document fits one window now
    first = prepared.items[0].input_ids.tolist()
    assert first[3:-1] == tokenizer.encode(long_document, add_special_tokens=False).ids[:5]
    assert prepared.truncated
    ranked = RERANK.decode(tokenizer, spec, [prepared], _logits(prepared, [0.5, 0.0]), RerankOptions())[0]
    assert {e["index"]: e["truncated"] for e in ranked} == {0: True, 1: False}


def test_sorted_by_relevance_cut_to_top_n_with_documents(tokenizer):
    spec = _spec(64)
    documents = ["alpha", "beta", "gamma", "delta"]
    prepared = RERANK.prepare(tokenizer, spec, RerankInput(query="q", documents=documents), RerankOptions())
    outputs = _logits(prepared, [0.1, 3.0, -2.0, 1.5])
    [ranked] = RERANK.decode(tokenizer, spec, [prepared], outputs, RerankOptions())
    assert [e["index"] for e in ranked] == [1, 3, 0, 2]
    scores = [e["relevance_score"] for e in ranked]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    [top] = RERANK.decode(tokenizer, spec, [prepared], outputs, RerankOptions(top_n=2, return_documents=True))
    assert top == [{"index": 1, "relevance_score": pytest.approx(0.9525741), "truncated": False,
                    "document": {"text": "beta"}},
                   {"index": 3, "relevance_score": pytest.approx(0.8175745), "truncated": False,
                    "document": {"text": "delta"}}]


def test_response_bytes_is_an_upper_bound(tokenizer):
    spec = _spec(64)
    documents = ['quote " and back\\slash', "tab\tand newline\n", "naïve café 東京 🙂", "plain"]
    options = RerankOptions(return_documents=True)
    prepared = RERANK.prepare(tokenizer, spec, RerankInput(query="q", documents=documents), options)
    [ranked] = RERANK.decode(tokenizer, spec, [prepared], _logits(prepared, [0.3, -0.1, 0.2, 0.0]), options)
    assert len(orjson.dumps(ranked)) <= RERANK.response_bytes(spec, prepared, options)
    top = RerankOptions(return_documents=True, top_n=1)
    assert RERANK.response_bytes(spec, prepared, top) < RERANK.response_bytes(spec, prepared, options)


def test_an_over_long_query_is_refused_naming_it(tokenizer):
    spec = _spec(32)
    fits = " ".join(["castle"] * 28)  # 28 tokens + 3 special tokens leave one for the document
    prepared = RERANK.prepare(tokenizer, spec, RerankInput(query=fits, documents=["bridge harbour"]), RerankOptions())
    assert [len(w) for w in prepared.items] == [32, 32]
    too_long = " ".join(["castle"] * 29)
    inputs = [RerankInput(query="fine", documents=["x"]), RerankInput(query=too_long, documents=["bridge"])]
    with pytest.raises(InputFailed) as failed:
        RERANK.prepare_many(tokenizer, spec, inputs, RerankOptions())
    assert failed.value.index == 1
    error = failed.value.error
    assert isinstance(error, QueryTooLong) and isinstance(error, InputTooLong)
    assert error.num_tokens == 29 and error.max_length == 32
    assert str(error).startswith("query is 29 tokens long") and "at most 28 tokens" in str(error)


def test_texts_name_the_query_and_each_document():
    raw = RerankInput(query="q", documents=["a", "b"])
    assert RERANK.texts(raw) == [("query", "q"), ("documents[0]", "a"), ("documents[1]", "b")]


def test_options_refuse_unknown_fields_and_bad_values():
    with pytest.raises(ValueError):
        RerankOptions(top_k=3)
    with pytest.raises(ValueError):
        RerankOptions(top_n=0)
    with pytest.raises(ValueError):
        RerankOptions(max_tokens_per_doc=0)


def test_mrr_and_top1_against_hand_computed_values():
    rankings = [[2, 0, 1], [0, 1, 2], [3, 1, 0, 2], list(range(12)), [5, 4, 3, 2, 1, 0]]
    relevant = [(0,), (0,), (2,), (11,), (0, 3)]
    # reciprocal ranks: 1/2, 1, 1/4, 0 (rank 12 > 10), 1/3 (the first relevant, 3, is third)
    metrics = ranking_metrics(rankings, relevant)
    assert metrics["mrr_at_10"] == pytest.approx((0.5 + 1 + 0.25 + 0 + 1 / 3) / 5)
    assert metrics["top1"] == pytest.approx(1 / 5)
    assert metrics["queries"] == 5


def test_score_reads_the_decoded_rankings(tmp_path):
    examples = read_article_questions(_tiny_squad(tmp_path))
    assert [e.relevant[0] for e in examples] == [0, 0, 1, 0]
    results = [[{"index": i, "relevance_score": 0.5, "truncated": False} for i in order]
               for order in ([1, 0, 2], [0], [1, 2, 0], [2, 1, 0])]
    metrics, updates = RERANK.score(_spec(), examples, results)
    assert metrics["mrr_at_10"] == pytest.approx((1 / 2 + 1 + 1 + 1 / 3) / 4)
    assert metrics["top1"] == pytest.approx(2 / 4)
    assert updates == {}


def _tiny_squad(folder: Path) -> Path:
    """Two articles: A with three paragraphs (two questions on the first, one on the second), B with one."""
    def qa(qid, question, answer, context):
        return {"id": qid, "question": question, "answers": [{"text": answer, "answer_start": context.index(answer)}]}

    a1 = "The castle was built in 1120 by the river."
    a2 = "The bridge crosses the river near the castle."
    a3 = "Farmers grow barley in the valley."
    b1 = "The glacier melts every summer."
    data = {"data": [
        {"title": "A", "paragraphs": [
            {"context": a1, "qas": [qa("a1-1", "When was the castle built?", "1120", a1),
                                    qa("a1-2", "What is the castle beside?", "the river", a1)]},
            {"context": a2, "qas": [qa("a2-1", "What crosses the river?", "bridge", a2)]},
            {"context": a3, "qas": []}]},
        {"title": "B", "paragraphs": [{"context": b1, "qas": [qa("b1-1", "What melts?", "glacier", b1)]}]},
    ], "version": "1.1"}
    path = folder / "tiny.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_reader_ranks_every_paragraph_of_the_article(tmp_path):
    examples = read_article_questions(_tiny_squad(tmp_path))
    # round-robin over articles, then over paragraphs: A's first paragraph, B, A's second paragraph, A's first again
    assert [e.id for e in examples] == ["a1-1", "b1-1", "a2-1", "a1-2"]
    first = examples[0]
    assert len(first.documents) == 3  # every paragraph of article A, the one without questions too
    assert first.relevant == (0,) and first.negatives == (1, 2)
    # "the river" is in both of A's first paragraphs: the second is not a negative of that question
    assert examples[3].relevant == (0,) and examples[3].negatives == (2,)
    assert examples[1].documents == ["The glacier melts every summer."] and examples[1].negatives == ()
    assert RERANK.served_input(first) == RerankInput(query=first.query, documents=first.documents)


def test_parity_inputs_hold_the_questions_own_paragraph():
    inputs = RERANK.parity_inputs(SAMPLES / "squad" / "dev.json", 6)
    examples = {e.query: e for e in read_article_questions(SAMPLES / "squad" / "dev.json")}
    assert len(inputs) == 6
    for raw in inputs:
        gold = examples[raw.query]
        assert gold.documents[gold.relevant[0]] in raw.documents and 2 <= len(raw.documents) <= 8
    assert len(RERANK.parity_inputs(None, 3)) == 3


def test_reader_ranks_only_a_questions_candidates_and_trains_on_its_mined_negatives(tmp_path):
    path = _tiny_squad(tmp_path)
    data = json.loads(path.read_text(encoding="utf-8"))
    first, second = data["data"][0]["paragraphs"][0]["qas"]
    first["candidates"] = [2, 0]  # the barley paragraph and its own, in that order; not the bridge one
    second["hard_negatives"] = [2]
    path.write_text(json.dumps(data), encoding="utf-8")
    examples = {e.id: e for e in read_article_questions(path)}
    castle = examples["a1-1"]
    assert castle.documents == ["Farmers grow barley in the valley.", "The castle was built in 1120 by the river."]
    assert castle.relevant == (1,) and castle.negatives == (0,)
    assert examples["a1-2"].negatives == (2,) and len(examples["a1-2"].documents) == 3
    assert len(examples["a2-1"].documents) == 3 and examples["a2-1"].negatives == (0, 2)  # no fields: as before


@pytest.mark.parametrize("field, value, message", [
    ("candidates", [1, 2], "must hold the question's own paragraph (0)"),
    ("candidates", [0, 7], "'candidates' must be a list of paragraph indices of its article (0 to 2)"),
    ("hard_negatives", "1", "'hard_negatives' must be a list of paragraph indices"),
])
def test_reader_refuses_candidates_and_negatives_that_are_not_its_articles_paragraphs(tmp_path, field, value,
                                                                                       message):
    path = _tiny_squad(tmp_path)
    data = json.loads(path.read_text(encoding="utf-8"))
    data["data"][0]["paragraphs"][0]["qas"][0][field] = value
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError) as refused:
        read_article_questions(path)
    assert message in str(refused.value) and "data[0].paragraphs[0].qas[0]" in str(refused.value)


def test_mrr_standard_error_against_hand_computed_values():
    # reciprocal ranks 1, 1/2, 0, 1/3: mean 11/24; sample variance sum((x - mean)^2) / 3
    rankings, gold = [[0, 1], [1, 0], [2, 3], [2, 1, 0]], [(0,), (0,), (0,), (0,)]
    ranks = [1, 1 / 2, 0, 1 / 3]
    mean = sum(ranks) / 4
    expected = math.sqrt(sum((x - mean) ** 2 for x in ranks) / 3 / 4)
    assert mrr_standard_error(rankings, gold) == pytest.approx(expected)
    # paired with a baseline that ranks every gold first: differences 0, -1/2, -1, -2/3
    differences = [0, -1 / 2, -1, -2 / 3]
    mean = sum(differences) / 4
    paired = math.sqrt(sum((x - mean) ** 2 for x in differences) / 3 / 4)
    assert mrr_standard_error(rankings, gold, [[0]] * 4) == pytest.approx(paired)


def test_the_shipped_rerank_samples_hold_mined_candidates_and_negatives():
    """dev: each question ranks 5 paragraphs of its article, its own among them; train: 3,000 questions, nearly
    all with 5 mined negatives, none holding its answer's text."""
    dev = read_article_questions(SAMPLES / "rerank" / "dev.json")
    assert len(dev) == 414 and all(len(e.documents) == 5 for e in dev)
    squad_dev = {e.id: e for e in read_article_questions(SAMPLES / "squad" / "dev.json")}
    for example in dev:
        own = squad_dev[example.id].documents[squad_dev[example.id].relevant[0]]
        assert example.documents[example.relevant[0]] == own
        assert set(example.documents) <= set(squad_dev[example.id].documents)
    train = json.loads((SAMPLES / "rerank" / "train.json").read_text(encoding="utf-8"))["data"]
    questions = [(article, q) for article in train for paragraph in article["paragraphs"] for q in paragraph["qas"]]
    assert len(questions) == 3000
    # a few questions' articles hold fewer than 3 excerpts without their answer: training leaves them out
    assert sum(len(q["hard_negatives"]) < 3 for _, q in questions) <= 10
    for article, q in questions:
        answer = q["answers"][0]["text"].lower()
        assert len(q["hard_negatives"]) <= 5
        assert all(answer not in article["paragraphs"][i]["context"].lower() for i in q["hard_negatives"])
