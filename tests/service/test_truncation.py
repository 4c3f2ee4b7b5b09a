"""Black-box: no route cuts an input without saying so. Token counts come from the bundle's own tokenizer.json
read with the `tokenizers` library here (what a client would count), not from the service."""

from __future__ import annotations

import httpx
import pytest
from tokenizers import Tokenizer

from tests.service.test_bounded_memory import long_texts


@pytest.fixture(scope="module")
def count_tokens(bundle_repository):
    tokenizers: dict[str, Tokenizer] = {}

    def count(model: str, text: str, pair: str | None = None) -> int:
        if model not in tokenizers:
            tokenizers[model] = Tokenizer.from_file(str(bundle_repository / model / "tokenizer.json"))
            tokenizers[model].no_truncation()
            tokenizers[model].no_padding()
        return len(tokenizers[model].encode(text, pair).ids)  # [CLS] ... [SEP] included

    return count


def max_length(client: httpx.Client, model: str) -> int:
    models = client.get("/v1/models").json()["models"]
    return next(m["max_seq_length"] for m in models if m["name"] == model)


def two_long_texts_sharing_their_start() -> tuple[str, str]:
    shared = " ".join(long_texts(2, 1100, shift=0))  # ~400 tokens
    first, second = long_texts(2, 2000, shift=20)
    return f"{shared} {first}", f"{shared} {second}"


def test_openai_embeddings_refuses_an_over_long_input_as_openai_does_naming_it_and_its_tokens(client, count_tokens):
    a, b = two_long_texts_sharing_their_start()
    response = client.post("/v1/embeddings", json={"model": "embeddings", "input": ["short text", b]})
    assert response.status_code == 400, response.text
    message = response.json()["error"]
    assert "input[1]" in message and str(count_tokens("embeddings", b)) in message and "truncate" in message


def test_openai_embeddings_with_truncate_says_what_was_cut_and_counts_what_was_sent(client, count_tokens):
    a, b = two_long_texts_sharing_their_start()
    limit = max_length(client, "embeddings")
    response = client.post("/v1/embeddings", json={"model": "embeddings", "input": [a, b, "short"], "truncate": True})
    assert response.status_code == 200, response.text
    body = response.json()
    sent = [count_tokens("embeddings", t) for t in (a, b, "short")]
    assert [d["truncated"] for d in body["data"]] == [True, True, False]
    assert [d["truncated_tokens"] for d in body["data"]] == [sent[0] - limit, sent[1] - limit, 0]
    assert body["usage"]["prompt_tokens"] == sum(sent)


def test_similarity_reports_the_tokens_cut_from_each_text(client, count_tokens):
    a, _ = two_long_texts_sharing_their_start()
    limit = max_length(client, "embeddings")
    response = client.post("/v1/similarity", json={"model": "embeddings",
                                                   "inputs": {"source": "a short source", "targets": ["short", a]}})
    assert response.status_code == 200, response.text
    assert response.json()["truncated_tokens"] == [[0, 0, count_tokens("embeddings", a) - limit]]
    refused = client.post("/v1/similarity", json={"model": "embeddings", "truncate": False,
                                                  "inputs": {"source": "a short source", "targets": ["short", a]}})
    assert refused.status_code == 413 and "inputs[0].targets[1]" in refused.json()["error"], refused.text


@pytest.mark.parametrize("route, model, make_input", [
    ("/v1/classify", "sentiment", lambda text: text),
    ("/v1/embed", "embeddings", lambda text: text),
])
def test_classify_and_embed_say_how_many_tokens_were_cut(client, count_tokens, route, model, make_input):
    text = long_texts(1, 1500, shift=5)[0]
    limit = max_length(client, model)
    response = client.post(route, json={"model": model, "inputs": [make_input(text), make_input("fine")]})
    assert response.status_code == 200, response.text
    cut, whole = response.json()["results"]
    assert (cut["truncated"], cut["truncated_tokens"]) == (True, count_tokens(model, text) - limit)
    assert (whole["truncated"], whole["truncated_tokens"]) == (False, 0)


def test_pair_cuts_are_counted_over_both_texts(client, count_tokens):
    text, pair = long_texts(2, 900, shift=11)
    limit = max_length(client, "similarity")
    response = client.post("/v1/pair", json={"model": "similarity", "inputs": {"text": text, "text_pair": pair}})
    assert response.status_code == 200, response.text
    result = response.json()["results"][0]
    assert result["truncated_tokens"] == count_tokens("similarity", text, pair) - limit


def test_a_qa_question_longer_than_the_model_reads_is_refused_not_cut(client):
    question = "Which of the following " + " ".join(["very"] * 80) + " long question words is it?"
    response = client.post("/v1/qa", json={"model": "reader", "inputs": {"question": question,
                                                                        "context": "The school was founded in 1821."}})
    assert response.status_code == 413, response.text
    assert "inputs[0].question" in response.json()["error"] and "max_query_length" in response.json()["error"]


def test_the_word_count_bound_never_exceeds_the_tokens_the_tokenizer_makes(bundle_repository):
    from service.inference import fewest_tokens

    tokenizer = Tokenizer.from_file(str(bundle_repository / "embeddings" / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    texts = [*long_texts(20, 1500, shift=7), "\u200b \u200b\u200b word", "e\u0301 \u0301 \u0301\u0301", "🚀🚀 🚀 a",
             "東京 大阪 北京", "don't stop-me now!!! ___ ...", "\t\n  ", "x"]
    for text in texts:
        sent = len(tokenizer.encode(text).ids)  # [CLS] ... [SEP]
        assert fewest_tokens([text]) <= sent, text
    # and a pair shares its specials: [CLS] a [SEP] b [SEP]
    assert fewest_tokens(["one two", "three"]) <= len(tokenizer.encode("one two", "three").ids)


def test_a_request_whose_words_alone_pass_the_token_budget_is_refused_before_tokenizing(client):
    text = " ".join(["a"] * 49_000)  # 98,000 characters, 49,000 words: more than 32,768 tokens whatever they are
    response = client.post("/v1/embed", json={"model": "embeddings", "inputs": [text, text]})
    assert response.status_code == 413, response.text
    assert "at least 98002 tokens" in response.json()["error"] and "max_tokens_per_request" in response.json()["error"]
