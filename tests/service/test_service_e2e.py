"""End to end: a real `berth serve` on a free loopback port, real bundles exported from the real
checkpoint, answers compared with transformers on the same fine-tuned folder (tests/service/reference.py,
which uses none of berth's encoding or decoding) and with gold spans written here."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.service import reference
from tests.service.conftest import API_KEY
from tests.service.models_for_tests import filler

SENTENCES = [
    "A charming and often affecting journey.",
    "Unflinchingly bleak and desperate.",
    "It's slow -- very, very slow.",
    "The acting, costumes, music and cinematography are all astounding.",
    "Ein Film über die Stadt, naïve und schön — 東京の夜.",
    "   extra   spaces\tand\ttabs   ",
]
TRICKY_TEXT = "  Café   au lait in  Zürich,\tthen   Paris —  naïve façade  東京 and London \u00a0 "


def post(client: httpx.Client, route: str, body: dict) -> dict:
    response = client.post(route, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_classify_agrees_with_pytorch(client, checkpoints):
    body = post(client, "/v1/classify", {"inputs": SENTENCES})
    expected = reference.classify(checkpoints["sentiment"], SENTENCES)
    assert body["model"] == "sentiment" and len(body["results"]) == len(SENTENCES)
    for got, want in zip(body["results"], expected):
        assert got["label"] == want["label"]
        assert got["score"] == pytest.approx(want["score"], abs=1e-4)
        assert got["truncated"] is False


def test_classify_single_input_top_k_and_truncation(client, checkpoints):
    single = post(client, "/v1/classify", {"inputs": SENTENCES[0], "model": "sentiment", "top_k": 2})
    want = reference.classify(checkpoints["sentiment"], SENTENCES[:1], top_k=2)[0]
    assert [e["label"] for e in single["results"][0]] == [e["label"] for e in want]
    assert single["results"][0][0]["score"] >= single["results"][0][1]["score"]

    long_text = " ".join(["wonderful"] * 200)  # 200 tokens; the model takes 64
    cut = post(client, "/v1/classify", {"inputs": long_text})["results"][0]
    assert cut["truncated"] is True
    assert cut["label"] == reference.classify(checkpoints["sentiment"], [long_text])[0]["label"]
    refused = client.post("/v1/classify", json={"inputs": long_text, "truncate": False})
    assert refused.status_code == 413 and refused.json()["error_type"] == "too_large"
    assert "202 tokens" in refused.json()["error"]


def test_pair_regression_agrees_with_pytorch(client, checkpoints):
    pairs = [{"text": a, "text_pair": b} for a, b in zip(SENTENCES, reversed(SENTENCES))]
    body = post(client, "/v1/pair", {"inputs": pairs})
    expected = reference.classify(checkpoints["similarity"], [p["text"] for p in pairs],
                                  [p["text_pair"] for p in pairs])
    assert body["model"] == "similarity"
    assert [r["score"] for r in body["results"]] == pytest.approx([e["score"] for e in expected], abs=1e-4)
    assert "label" not in body["results"][0]
    one = post(client, "/v1/pair", {"inputs": pairs[0]})
    assert one["results"][0]["score"] == pytest.approx(body["results"][0]["score"], abs=1e-5)


# Gold spans, counted by hand in TRICKY_TEXT and in "We flew to Tokyo, then on to Sydney."
GOLD_CITIES = [{("Zürich", 21, 27), ("Paris", 36, 41), ("London", 66, 72)}, {("Tokyo", 11, 16), ("Sydney", 29, 35)}]


@pytest.mark.parametrize("aggregation", ["simple", "first", "average", "max", "none"])
def test_ner_offsets_match_transformers_and_gold_spans(client, checkpoints, aggregation):
    texts = [TRICKY_TEXT, "We flew to Tokyo, then on to Sydney.", "no places here at all"]
    body = post(client, "/v1/ner", {"inputs": texts, "aggregation": aggregation})
    for text, got in zip(texts, body["results"]):
        want = reference.entities(checkpoints["entities"], text, aggregation)
        assert [(e["entity"], e["start"], e["end"]) for e in got] == [(e["entity"], e["start"], e["end"]) for e in want]
    if aggregation != "none":
        for gold, got in zip(GOLD_CITIES, body["results"]):
            assert gold <= {(e["text"], e["start"], e["end"]) for e in got}


def test_ner_finds_an_entity_at_the_very_end_of_a_long_text(client):
    text = filler(1500, 7) + " In the end the whole delegation arrived in Paris"
    got = post(client, "/v1/ner", {"inputs": text})["results"][0]
    assert got and got[-1]["text"] == "Paris" and got[-1]["end"] == len(text)
    assert text[got[-1]["start"] : got[-1]["end"]] == "Paris"


def test_qa_answers_with_exact_offsets(client, checkpoints):
    context = ("Le musée   d'Orsay, à Paris — fondé en 1986 —  abrite des œuvres de Monet.\t"
               "The museum was founded in 1986.")
    inputs = [{"question": "When was the museum founded?", "context": context},
              {"question": "When was the library founded?",
               "context": filler(30, 3) + " The library was founded in 1911. " + filler(20, 4)}]
    body = post(client, "/v1/qa", {"inputs": inputs, "model": "reader"})
    for item, got in zip(inputs, body["results"]):
        want = reference.answers(checkpoints["reader"], item["question"], item["context"])[0]
        assert (got["answer"], got["start"], got["end"]) == (want.answer, want.start, want.end)
        assert got["is_impossible"] is False
    gold_1911 = len(inputs[1]["context"]) - len(filler(20, 4)) - 6  # "... founded in 1911. " + filler
    assert (body["results"][1]["answer"], body["results"][1]["start"]) == ("1911", gold_1911)
    assert body["results"][1]["end"] == gold_1911 + 4
    ranked = post(client, "/v1/qa", {"inputs": inputs[1], "top_k": 3})["results"][0]
    assert len(ranked) == 3 and ranked[0]["answer"] == "1911"
    assert ranked[0]["score"] >= ranked[1]["score"] >= ranked[2]["score"]


def test_qa_over_a_5000_word_context_finds_the_answer_near_the_end(client):
    context = filler(4900, 9) + " The observatory was founded in 1954. " + filler(60, 10)
    question = "When was the observatory founded?"
    response = client.post("/v1/qa", json={"inputs": {"question": question, "context": context}})
    assert response.status_code == 200, response.text
    got = response.json()["results"][0]
    gold = len(context) - len(filler(60, 10)) - 6  # "... founded in 1954. " + filler
    assert (got["answer"], got["start"], got["end"]) == ("1954", gold, gold + 4)
    for header in ("x-total-time", "x-queue-time", "x-inference-time", "x-tokenization-time"):
        assert float(response.headers[header]) >= 0
    stages = dict(part.strip().split(";dur=") for part in response.headers["server-timing"].split(","))
    assert set(stages) == {"parse", "tokenize", "queue", "pad", "inference", "wake", "decode", "serialize", "total"}
    assert float(stages["total"]) >= float(stages["inference"]) > 0


def test_200_concurrent_mixed_requests_each_get_their_own_results(server, checkpoints):
    rng = random.Random(0)
    cities = ["Paris", "London", "Berlin", "Madrid", "Tokyo", "Lisbon", "Vienna", "Prague"]
    requests = []
    for i in range(200):
        kind = i % 4
        if kind == 0:
            texts = [f"{SENTENCES[j % 4]} #{i}-{j}" for j in range(rng.randint(1, 3))]
            requests.append(("/v1/classify", {"inputs": texts}, texts))
        elif kind == 1:
            city = cities[i % len(cities)]
            text = f"{filler(rng.randint(5, 40), i)} We flew to {city} last week."
            requests.append(("/v1/ner", {"inputs": text}, (text, city)))
        elif kind == 2:
            year = 1800 + i
            context = f"{filler(rng.randint(10, 60), i)} The school was founded in {year}. {filler(10, i + 1)}"
            requests.append(("/v1/qa", {"inputs": {"question": "When was the school founded?", "context": context}},
                             (context, str(year))))
        else:
            pair = {"text": f"request {i}", "text_pair": SENTENCES[i % 6]}
            requests.append(("/v1/pair", {"inputs": [pair]}, pair))

    async def send_all():
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits,
                                     headers={"Authorization": f"Bearer {API_KEY}"}) as c:
            return await asyncio.gather(*(c.post(route, json=body) for route, body, _ in requests))

    responses = asyncio.run(send_all())
    assert [r.status_code for r in responses] == [200] * 200
    classify_texts = [t for route, _, texts in requests if route == "/v1/classify" for t in texts]
    expected_labels = iter(reference.classify(checkpoints["sentiment"], classify_texts))
    for (route, _, expected), response in zip(requests, responses):
        results = response.json()["results"]
        if route == "/v1/classify":
            assert len(results) == len(expected)
            assert [r["label"] for r in results] == [next(expected_labels)["label"] for _ in expected]
        elif route == "/v1/ner":
            text, city = expected
            assert any(e["text"] == city and text[e["start"] : e["end"]] == city for e in results[0])
        elif route == "/v1/qa":
            context, year = expected
            assert results[0]["answer"] == year and context[results[0]["start"] : results[0]["end"]] == year
        else:
            assert len(results) == 1 and isinstance(results[0]["score"], float)


def test_models_listing_probes_and_docs(client):
    listing = client.get("/v1/models").json()
    by_name = {m["name"]: m for m in listing["models"]}
    assert set(by_name) == {"sentiment", "similarity", "entities", "reader", "embeddings", "masker", "chooser",
                            "ranker"}
    assert {by_name[n]["task"] for n in ("embeddings", "masker", "chooser", "ranker")} == {
        "embedding", "fill-mask", "multiple-choice", "rerank"}
    assert by_name["embeddings"]["max_seq_length"] == 256  # the base's sentence_bert_config.json
    assert by_name["entities"]["task"] == "ner" and by_name["entities"]["labels"] == ["O", "B-LOC", "I-LOC"]
    assert all(m["ready"] and m["execution_provider"] == "CPUExecutionProvider" and m["precision"] == "fp32"
               for m in by_name.values())
    assert by_name["reader"]["max_seq_length"] == 128
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").json()["status"] == "ready"
    schema = client.get("/openapi.json").json()
    assert {"/v1/classify", "/v1/pair", "/v1/ner", "/v1/qa", "/v1/models", "/v1/embed", "/v1/embeddings",
            "/v1/similarity", "/v1/fill-mask", "/v1/choice"} <= set(schema["paths"])
    assert "examples" in str(schema["components"]["schemas"]["QARequest"])
    assert client.get("/docs").status_code == 200


def test_metrics_parse_and_hold_the_histograms(client):
    post(client, "/v1/classify", {"inputs": ["warm", "up"]})
    text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("berth_request_duration_seconds", "berth_queue_wait_seconds", "berth_inference_duration_seconds",
                 "berth_batch_size", "berth_batch_tokens"):
        assert families[name].type == "histogram", name
        counts = [s.value for s in families[name].samples if s.name == name + "_count"]
        assert sum(counts) > 0, name
        assert any(s.name == name + "_bucket" and s.labels.get("le") == "+Inf" for s in families[name].samples)
    assert families["berth_queue_depth"].type == "gauge"
    requests = [s for s in families["berth_requests"].samples if s.name == "berth_requests_total"]
    assert any(s.labels == {"route": "/v1/classify", "model": "sentiment", "status": "200"} and s.value >= 1
               for s in requests)
    info = [s.labels for s in families["berth_model_info"].samples]
    assert {"model": "reader", "task": "qa", "precision": "fp32", "provider": "CPUExecutionProvider"} in info
    assert {s.labels["reason"] for s in families["berth_items_dropped"].samples} >= {"cancelled", "expired"}


def test_span_ends_never_split_a_grapheme_cluster(client):
    """A combining accent after the last letter (decomposed "Paris" + U+0301) is dropped by the uncased
    normalizer, so the token's offsets stop before it; the span must take it. Gold spans written here."""
    text = "We flew to Paris\u0301 last week, then to Lisbon\u0301\u0327 by train."
    got = post(client, "/v1/ner", {"inputs": text})["results"][0]
    assert [(e["text"], e["start"], e["end"]) for e in got] == [("Paris\u0301", 11, 17),
                                                                 ("Lisbon\u0301\u0327", 37, 45)]
    context = "The bridge opened in 1907\u0301 after a long delay."
    answer = post(client, "/v1/qa", {"inputs": {"question": "When did the bridge open?",
                                                "context": context}})["results"][0]
    assert (answer["answer"], answer["start"], answer["end"]) == ("1907\u0301", 21, 26)
