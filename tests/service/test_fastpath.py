"""The fast path (service/fastpath.py) and FastAPI's own path answer every inference request alike.

A body sent as `application/json` takes the fast path; the same bytes sent as `application/merge-patch+json`
(a JSON type FastAPI parses as JSON) go through FastAPI's routing, dependencies and body validation to the
same endpoint. Answers, statuses and errors must match, on the real server."""

from __future__ import annotations

import json

import pytest
from fastapi.routing import APIRoute

from service.fastpath import FastPath
from service.routes import v1

FAST = {"Content-Type": "application/json"}
VIA_FASTAPI = {"Content-Type": "application/merge-patch+json"}


def test_every_inference_route_takes_the_fast_path():
    posts = {r.path for r in v1.routes if isinstance(r, APIRoute) and "POST" in r.methods}
    assert set(FastPath(None, v1).routes) == posts and len(posts) == 10


CASES = [
    ("/v1/classify", {"inputs": ["a gripping , funny film", "dull and lifeless"], "top_k": 2}),
    ("/v1/pair", {"inputs": {"text": "The cat sat on the mat.", "text_pair": "A cat was sitting on the mat."}}),
    ("/v1/ner", {"inputs": "Angela Merkel met Emmanuel Macron in Paris on Monday."}),
    ("/v1/qa", {"inputs": {"question": "Where did they meet?", "context": "Angela Merkel met Emmanuel Macron "
                           "in Paris on Monday."}}),
    ("/v1/embed", {"inputs": ["a sentence", "another one"], "model": "embeddings"}),
    ("/v1/embeddings", {"input": "a sentence", "model": "embeddings"}),
    # errors: pydantic's (with their locations), the route's own checks, the model lookup, the limits
    ("/v1/classify", {"inputs": "x", "topk": 3}),
    ("/v1/classify", {"inputs": 5, "top_k": "many"}),
    ("/v1/classify", {}),
    ("/v1/qa", {"inputs": {"question": "why?"}}),
    ("/v1/ner", {"inputs": ["fine", " \t "]}),
    ("/v1/classify", {"inputs": "x", "model": "nope"}),
    ("/v1/classify", {"inputs": "x", "model": "entities"}),
    ("/v1/classify", {"inputs": ["hi"] * 10_000}),
    ("/v1/choice", {"inputs": {"context": "c", "choices": ["only"]}}),
]


def same(a, b) -> bool:
    """Equal, floats within 1e-4 (the two requests may share a forward pass with different padding)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-4
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("route,body", CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_the_fast_path_answers_as_fastapi_does(client, route, body):
    raw = json.dumps(body).encode("utf-8")
    fast = client.post(route, content=raw, headers=FAST)
    slow = client.post(route, content=raw, headers=VIA_FASTAPI)
    assert fast.status_code == slow.status_code, (fast.text, slow.text)
    if fast.status_code == 200:
        assert fast.headers["x-model"] == slow.headers["x-model"]
        assert same(fast.json(), slow.json()), (fast.json(), slow.json())
    else:
        assert fast.json() == slow.json()


def test_an_escaped_unpaired_surrogate_is_refused_by_the_route_on_both_paths(client):
    raw = b'{"inputs": "abc \\ud800 def"}'  # valid JSON; pydantic's own parser refuses it
    for headers in (FAST, VIA_FASTAPI):
        response = client.post("/v1/classify", content=raw, headers=headers)
        assert response.status_code == 422
        assert "unpaired surrogate at character 4" in response.json()["error"]


def test_invalid_json_says_where_on_the_fast_path(client):
    response = client.post("/v1/classify", content=b'{"inputs": "unterminated', headers=FAST)
    assert response.status_code == 400 and response.json()["error_type"] == "validation"
    assert "Invalid JSON" in response.json()["error"] and "line 1 column" in response.json()["error"]


def test_a_body_nested_too_deep_is_a_400_on_both_paths(client):
    raw = b'{"inputs": ' + b"[" * 1100 + b"]" * 1100 + b"}"  # ~2 KB
    for headers in (FAST, VIA_FASTAPI):
        response = client.post("/v1/classify", content=raw, headers=headers)
        assert response.status_code == 400, response.text
        assert response.json()["error_type"] == "validation" and "JSON" in response.json()["error"]
