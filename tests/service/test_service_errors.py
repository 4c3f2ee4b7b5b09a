"""The bad-input battery: each case gets the right status and the one error shape, and the server is
healthy and answering right after it."""

from __future__ import annotations

import json

import pytest

from tests.service.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
JSON = {"Content-Type": "application/json"}


def raw(text: str) -> bytes:
    return text.encode("utf-8")


def as_json(value) -> bytes:
    return json.dumps(value).encode("utf-8")


CASES = [
    # (case id, route, body bytes, extra headers, status, error_type, words the message must contain)
    ("invalid-json", "/v1/classify", raw('{"inputs": "unterminated'), JSON, 400, "validation", ["JSON"]),
    # ~2 KB nested deeper than any JSON parser here takes (orjson stops at 1,024; the standard parser overflows)
    ("nested-lists", "/v1/classify", raw('{"inputs": ' + "[" * 1100 + "]" * 1100 + "}"), JSON, 400, "validation",
     ["JSON"]),
    ("not-json-content-type", "/v1/classify", raw('{"inputs": "x"}'),
     {"Content-Type": "text/plain"}, 422, "validation", ["Content-Type: application/json"]),
    ("body-null", "/v1/classify", raw("null"), JSON, 422, "validation", []),
    ("inputs-number", "/v1/classify", as_json({"inputs": 123}), JSON, 422, "validation", ["inputs"]),
    ("inputs-list-with-number", "/v1/classify", as_json({"inputs": ["fine", 5]}), JSON, 422, "validation", []),
    ("top-k-not-int", "/v1/classify", as_json({"inputs": "x", "top_k": "many"}), JSON, 422, "validation", ["top_k"]),
    ("top-k-zero", "/v1/classify", as_json({"inputs": "x", "top_k": 0}), JSON, 422, "validation", ["top_k"]),
    ("unknown-field", "/v1/classify", as_json({"inputs": "x", "topk": 3}), JSON, 422, "validation", ["topk"]),
    ("missing-inputs", "/v1/classify", as_json({}), JSON, 422, "validation", ["inputs"]),
    ("qa-missing-context", "/v1/qa", as_json({"inputs": {"question": "why?"}}), JSON, 422, "validation",
     ["context"]),
    ("qa-string-inputs", "/v1/qa", as_json({"inputs": "why?"}), JSON, 422, "validation", []),
    ("pair-missing-text-pair", "/v1/pair", as_json({"inputs": [{"text": "a"}]}), JSON, 422, "validation",
     ["text_pair"]),
    ("ner-bad-aggregation", "/v1/ner", as_json({"inputs": "x", "aggregation": "mean"}), JSON, 422, "validation",
     ["aggregation"]),
    ("empty-string", "/v1/classify", as_json({"inputs": ""}), JSON, 422, "validation", ["empty"]),
    ("whitespace-only", "/v1/ner", as_json({"inputs": ["fine", " \t\n "]}), JSON, 422, "validation",
     ["inputs[1]", "empty"]),
    ("qa-empty-context", "/v1/qa", as_json({"inputs": {"question": "why?", "context": ""}}), JSON, 422,
     "validation", ["context", "empty"]),
    ("empty-list", "/v1/classify", as_json({"inputs": []}), JSON, 422, "validation", ["empty"]),
    ("inputs-null", "/v1/classify", as_json({"inputs": None}), JSON, 422, "validation", []),
    ("list-of-nulls", "/v1/ner", as_json({"inputs": [None, None]}), JSON, 422, "validation", []),
    ("model-null-is-default", "/v1/classify", as_json({"inputs": "fine", "model": None}), JSON, 200, None, []),
    ("ten-megabyte-body", "/v1/classify", as_json({"inputs": "a" * 10_000_000}), JSON, 413, "too_large", ["body"]),
    ("ten-thousand-inputs", "/v1/classify", as_json({"inputs": ["hi"] * 10_000}), JSON, 413, "too_large",
     ["10000 inputs"]),
    ("million-character-text", "/v1/ner", as_json({"inputs": "word " * 200_000}), JSON, 413, "too_large",
     ["1000000 characters"]),
    ("lone-surrogate", "/v1/classify", raw('{"inputs": "abc \\ud800 def"}'), JSON, 422, "validation",
     ["surrogate"]),
    ("latin-1-body", "/v1/classify", '{"inputs": "caf\xe9"}'.encode("latin-1"), JSON, 400, "validation",
     ["not UTF-8", "0xe9", "offset 15"]),
    # a boolean option takes true or false only (pydantic would read "off", "no", "0" and 0 as false)
    ("truncate-as-string", "/v1/classify", as_json({"inputs": "x", "truncate": "off"}), JSON, 422, "validation",
     ["truncate"]),
    ("normalize-as-number", "/v1/embed", as_json({"inputs": "x", "normalize": 0}), JSON, 422, "validation",
     ["normalize"]),
    # texts of characters BERT's tokenizer drops (NUL, zero-width space, byte-order mark, a lone accent): the model
    # would read only [CLS] [SEP]
    ("only-format-characters", "/v1/classify", as_json({"inputs": ["fine", "\u200b\ufeff"]}), JSON, 422,
     "validation", ["inputs[1]", "no text"]),
    ("only-nul", "/v1/embed", as_json({"inputs": "\x00"}), JSON, 422, "validation", ["inputs[0]", "no text"]),
    ("qa-lone-accent-context", "/v1/qa", as_json({"inputs": {"question": "who?", "context": "\u0301"}}), JSON, 422,
     "validation", ["inputs[0].context", "no text"]),
    ("pair-zero-width-text-pair", "/v1/pair", as_json({"inputs": {"text": "a", "text_pair": "\u200b"}}), JSON,
     422, "validation", ["text_pair", "no text"]),
    ("emoji-only-is-read", "/v1/classify", as_json({"inputs": "\U0001f600 !!"}), JSON, 200, None, []),
    ("trailing-slash", "/v1/classify/", as_json({"inputs": "x"}), JSON, 404, "not_found", ["/v1/classify/"]),
    ("unknown-model", "/v1/classify", as_json({"inputs": "x", "model": "nope"}), JSON, 404, "not_found", ["nope"]),
    ("wrong-task-model", "/v1/classify", as_json({"inputs": "x", "model": "entities"}), JSON, 422, "validation",
     ["/v1/ner"]),
    ("qa-model-on-pair-route", "/v1/pair", as_json({"inputs": {"text": "a", "text_pair": "b"}, "model": "reader"}),
     JSON, 422, "validation", ["/v1/qa"]),
    # the embedding, fill-mask and multiple-choice routes
    ("choice-empty-choices", "/v1/choice", as_json({"inputs": {"context": "c", "choices": []}}), JSON, 422,
     "validation", ["choices", "at least 2"]),
    ("choice-one-choice", "/v1/choice", as_json({"inputs": {"context": "c", "choices": ["only"]}}), JSON, 422,
     "validation", ["choices", "at least 2"]),
    ("choice-1000-choices", "/v1/choice", as_json({"inputs": {"context": "c", "choices": ["x"] * 1000}}), JSON,
     413, "too_large", ["1000", "limit"]),
    ("choice-empty-choice-text", "/v1/choice", as_json({"inputs": {"context": "c", "choices": ["a", " "]}}), JSON,
     422, "validation", ["choices[1]", "empty"]),
    ("choice-missing-context", "/v1/choice", as_json({"inputs": {"choices": ["a", "b"]}}), JSON, 422, "validation",
     ["context"]),
    ("fill-mask-no-mask-token", "/v1/fill-mask", as_json({"inputs": ["Paris is the [MASK].", "Paris is nice."]}),
     JSON, 422, "validation", ["inputs[1]", "[MASK]"]),
    ("fill-mask-top-k-too-large", "/v1/fill-mask", as_json({"inputs": "a [MASK]", "top_k": 1000}), JSON, 422,
     "validation", ["top_k"]),
    ("embed-empty-list", "/v1/embed", as_json({"inputs": []}), JSON, 422, "validation", ["empty"]),
    ("embed-bad-output", "/v1/embed", as_json({"inputs": "x", "output": "words"}), JSON, 422, "validation",
     ["output"]),
    ("embed-layer-out-of-range", "/v1/embed", as_json({"inputs": "x", "output": "tokens", "layers": [-1, 9]}),
     JSON, 422, "validation", ["layer 9"]),
    ("embed-tokens-too-many-inputs", "/v1/embed", as_json({"inputs": ["x"] * 17, "output": "tokens"}), JSON, 413,
     "too_large", ["at most 16"]),
    ("embed-layers-without-tokens", "/v1/embed", as_json({"inputs": "x", "layers": [-2]}), JSON, 422,
     "validation", ["tokens"]),
    ("embeddings-token-id-not-in-vocabulary", "/v1/embeddings", as_json({"input": [[101, 40000]],
                                                                         "model": "embeddings"}), JSON, 422,
     "validation", ["input[0][1]", "40000"]),
    ("embeddings-wrong-dimensions", "/v1/embeddings", as_json({"input": "x", "model": "embeddings",
                                                               "dimensions": 64}), JSON, 422, "validation",
     ["dimensions", "384"]),
    ("embeddings-unknown-model", "/v1/embeddings", as_json({"input": "x", "model": "text-embedding-3-small"}),
     JSON, 404, "not_found", ["text-embedding-3-small"]),
    ("similarity-no-targets", "/v1/similarity", as_json({"inputs": {"source": "a", "targets": []}}), JSON, 422,
     "validation", ["targets", "empty"]),
    ("similarity-1000-targets", "/v1/similarity", as_json({"inputs": {"source": "a", "targets": ["b"] * 1000}}),
     JSON, 413, "too_large", ["1000", "limit"]),
    # the documented most: 256 targets (the source is free of max_items_per_request, 256 here as by default)
    ("similarity-256-targets", "/v1/similarity", as_json({"inputs": {"source": "a", "targets": ["b"] * 256}}),
     JSON, 200, None, []),
    ("similarity-two-sources-share-the-items", "/v1/similarity",
     as_json({"inputs": [{"source": "a", "targets": ["b"] * 200}, {"source": "c", "targets": ["d"] * 57}]}), JSON,
     413, "too_large", ["259 model inputs", "258"]),
    ("classifier-on-embed-route", "/v1/embed", as_json({"inputs": "x", "model": "sentiment"}), JSON, 422,
     "validation", ["/v1/classify"]),
    ("embedding-model-on-classify-route", "/v1/classify", as_json({"inputs": "x", "model": "embeddings"}), JSON,
     422, "validation", ["/v1/embed"]),
    ("masker-on-choice-route", "/v1/choice", as_json({"inputs": {"context": "c", "choices": ["a", "b"]},
                                                      "model": "masker"}), JSON, 422, "validation",
     ["/v1/fill-mask"]),
    ("chooser-on-fill-mask-route", "/v1/fill-mask", as_json({"inputs": "a [MASK]", "model": "chooser"}), JSON, 422,
     "validation", ["/v1/choice"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_the_right_error_and_the_server_stays_healthy(client, case):
    _, route, body, headers, status, error_type, words = case
    response = client.post(route, content=body, headers=headers)
    assert response.status_code == status, response.text
    if error_type is not None:
        payload = response.json()
        assert set(payload) <= {"error", "error_type", "detail"} and payload["error_type"] == error_type
        assert isinstance(payload["error"], str) and payload["error"]
        for word in words:
            assert word in payload["error"], payload["error"]
    assert_healthy(client)


def assert_healthy(client) -> None:
    assert client.get("/healthz").status_code == 200
    answer = client.post("/v1/classify", json={"inputs": ["still fine?"]})
    assert answer.status_code == 200 and len(answer.json()["results"]) == 1


def test_control_characters_are_accepted_and_offsets_still_slice(client):
    text = "\x00\x01 We flew to\x07 Paris\u200b last\x1f week \x7f\ufeff"
    response = client.post("/v1/ner", json={"inputs": [text, "\x00\x02\x03"]})
    assert response.status_code == 200, response.text
    entities, nothing = response.json()["results"]
    assert [(e["text"], e["start"], e["end"]) for e in entities] == [("Paris", 15, 20)]  # gold, counted by hand
    assert nothing == []


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY},
                                     {"Authorization": "Basic " + API_KEY}])
def test_wrong_or_missing_api_key_is_401(server, headers):
    import httpx

    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        for method, route, body in (("POST", "/v1/classify", {"inputs": "x"}), ("GET", "/v1/models", None)):
            response = anonymous.request(method, route, json=body, headers=headers)
            assert response.status_code == 401
            assert response.json()["error_type"] == "unauthorized"
            assert response.headers["www-authenticate"] == "Bearer"
        assert anonymous.get("/healthz").status_code == 200  # probes need no key
        assert anonymous.get("/metrics").status_code == 200


def test_unknown_route_and_wrong_method_keep_the_error_shape(client):
    missing = client.get("/v2/classify")
    assert missing.status_code == 404 and missing.json()["error_type"] == "not_found"
    wrong_method = client.get("/v1/classify")
    assert wrong_method.status_code == 405 and wrong_method.json()["error_type"] == "validation"
