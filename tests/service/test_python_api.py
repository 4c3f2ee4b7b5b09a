"""The Python API (berth/api.py) against the HTTP routes (here, beside the service tests, to share their session's
bundles): for every task, a bundle loaded with `berth.load` answers
what a real `berth serve` (uvicorn on 127.0.0.1, ONNX Runtime) answers for the same inputs and options, and
refuses what the route refuses with the route's status and message. The README's Python example runs as written.

The expectation is the server's answer over HTTP; floats may differ in their last bits only because the server
batches a request with its own padding (the forward pass is the same ONNX graph on the same feeds).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from typing import Any

import httpx
import pytest

from tests.service.conftest import REPO, ServerProcess

LONG = " ".join(["The committee met again on Tuesday to discuss the budget."] * 40) + " She moved to Lisbon."

# (bundle, route, request body): every task's own route, and the embedding task's other routes.
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("sentiment", "/v1/classify", {"inputs": ["A wonderful, moving film.", "Dull and far too long."]}),
    ("sentiment", "/v1/classify", {"inputs": "One input, not a list.", "top_k": 2}),
    ("sentiment", "/v1/classify", {"inputs": [LONG], "truncate": True}),
    ("similarity", "/v1/pair", {"inputs": [{"text": "A man is playing a guitar.",
                                            "text_pair": "Someone plays an instrument."},
                                           {"text": "The cat sleeps.", "text_pair": "Stocks fell sharply today."}]}),
    ("entities", "/v1/ner", {"inputs": ["We flew to Paris last week.", "The train from Berlin was late again."],
                             "aggregation": "simple"}),
    ("entities", "/v1/ner", {"inputs": LONG, "aggregation": "none"}),
    ("reader", "/v1/qa", {"inputs": [{"question": "When was the school founded?",
                                      "context": "The school was founded in 1921 in a small village."},
                                     {"question": "Where was she born?",
                                      "context": "She was born in Oslo and moved to Rome in 1990."}], "top_k": 2}),
    ("embeddings", "/v1/embed", {"inputs": ["A sentence to embed.", "Another one, longer than the first."]}),
    ("embeddings", "/v1/embed", {"inputs": "Token vectors.", "output": "tokens"}),
    ("masker", "/v1/fill-mask", {"inputs": ["Paris is the [MASK] of France.", "I [MASK] to the [MASK]."],
                                 "top_k": 3}),
    ("chooser", "/v1/choice", {"inputs": {"context": "She was cold, so she",
                                          "choices": ["put on a coat.", "ate an ice cream.", "opened the window."]}}),
]
# Routes whose whole answer is compared (Model.request), not only `results`.
WHOLE: list[tuple[str, str, dict[str, Any]]] = [
    ("embeddings", "/v1/embeddings", {"input": ["OpenAI's shape.", "Two texts."]}),
    ("embeddings", "/v1/similarity", {"inputs": {"source": "A cat sat on the mat.",
                                                 "targets": ["A kitten rests on a rug.", "Interest rates rose."]}}),
    ("ranker", "/v1/rerank", {"query": "What is it like in Oslo?", "top_n": 2, "return_documents": True,
                              "documents": ["Oslo is cold and bright in the spring.", "The bank raised rates.",
                                            "Tokyo is busy at night."]}),
]


def same(api: Any, http: Any, where: str = "") -> None:
    """Equal JSON values; floats to 1e-5 (relative or absolute)."""
    if isinstance(http, float) or isinstance(api, float):
        assert math.isclose(api, http, rel_tol=1e-5, abs_tol=1e-5), f"{where}: {api} != {http}"
    elif isinstance(http, dict):
        assert isinstance(api, dict) and api.keys() == http.keys(), f"{where}: keys {api} != {http}"
        for key in http:
            same(api[key], http[key], f"{where}.{key}")
    elif isinstance(http, list):
        assert isinstance(api, list) and len(api) == len(http), f"{where}: {api} != {http}"
        for i, (a, h) in enumerate(zip(api, http)):
            same(a, h, f"{where}[{i}]")
    else:
        assert api == http, f"{where}: {api!r} != {http!r}"


@pytest.fixture(scope="module")
def http(bundle_repository, tmp_path_factory):
    server = ServerProcess(bundle_repository, tmp_path_factory.mktemp("api-logs") / "serve.log")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=120) as client:
            yield client
    finally:
        server.stop()


@pytest.fixture(scope="module")
def models(bundle_repository):
    import berth

    loaded: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in loaded:
            loaded[name] = berth.load(bundle_repository / name, threads=1)
        return loaded[name]

    return get


@pytest.mark.parametrize(("name", "route", "body"), CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_call_equals_the_route(http, models, name, route, body):
    response = http.post(route, json={"model": name, **body})
    assert response.status_code == 200, response.text
    expected = response.json()["results"]
    model = models(name)
    assert model.routes[0] == route
    options = {k: v for k, v in body.items() if k != "inputs"}
    got = model(body["inputs"], **options)
    if isinstance(body["inputs"], list):
        same(got, expected, route)
    else:  # one input: its result, where the route answers a list of one
        same(got, expected[0], route)


@pytest.mark.parametrize(("name", "route", "body"), WHOLE, ids=[c[1] for c in WHOLE])
def test_request_equals_the_whole_answer(http, models, name, route, body):
    response = http.post(route, json={"model": name, **body})
    assert response.status_code == 200, response.text
    expected = response.json()
    got = models(name).request(route, body)
    if route == "/v1/rerank":  # Cohere's shape carries a fresh id per answer
        assert re.fullmatch(r"[0-9a-f-]{36}", got.pop("id")) and expected.pop("id")
        same(models(name)(**body), expected["results"], "call")
    same(got, expected, route)


@pytest.mark.parametrize(("name", "route", "body"), [
    ("sentiment", "/v1/classify", {"inputs": ["fine", "   "]}),  # empty text: 422 naming inputs[1]
    ("sentiment", "/v1/classify", {"inputs": "fine", "top_k": 0}),  # out of range: pydantic's 422
    ("sentiment", "/v1/classify", {"inputs": [LONG * 2], "truncate": False}),  # too long, not cut: 413
    ("masker", "/v1/fill-mask", {"inputs": "No mask in this text."}),
    ("reader", "/v1/qa", {"inputs": {"question": "Where?"}}),  # a field missing
    ("sentiment", "/v1/classify", {"inputs": "fine", "colour": "red"}),  # an unknown option
], ids=["empty", "top_k", "too-long", "no-mask", "missing-field", "unknown-option"])
def test_refusals_equal_the_routes(http, models, name, route, body):
    import berth

    response = http.post(route, json={"model": name, **body})
    assert 400 <= response.status_code < 500, response.text
    with pytest.raises(berth.RequestError) as refused:
        models(name).request(route, body)
    assert refused.value.status == response.status_code
    assert refused.value.error_type == response.json()["error_type"]
    assert str(refused.value) == response.json()["error"]


def test_a_large_list_runs_in_batches_past_the_services_request_limit(models):
    """The service caps inputs per request (256 by default); the library runs any list, in order."""
    model = models("sentiment")
    texts = [f"Review number {i}: {'great' if i % 2 else 'awful'} film." for i in range(300)]
    got = model(texts)
    assert len(got) == 300
    same(got[7], model(texts[7]), "item 7")
    same(got[298], model(texts[298]), "item 298")


def test_load_by_name_from_the_model_repository(bundle_repository, monkeypatch):
    import berth

    monkeypatch.setenv("BERTH_MODELS", str(bundle_repository))
    model = berth.load("sentiment", threads=1)
    assert (model.name, model.task) == ("sentiment", "classification")
    assert len(model.labels) == 2
    with pytest.raises(FileNotFoundError, match="no bundle"):
        berth.load("not-a-bundle")


def readme_python_example() -> str:
    """The first ```python block of README.md's "Python API" section."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Python API", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs(bundle_repository, tmp_path):
    """Run as a user would: its own process, in a folder whose models/ is the model repository."""
    (tmp_path / "models").symlink_to(bundle_repository)
    script = tmp_path / "example.py"
    script.write_text(readme_python_example(), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    entities, scores, refused = done.stdout.splitlines()
    assert "'text': 'Paris', 'start': 17, 'end': 22" in entities  # "Tim Cook flew to Paris"[17:22]
    assert len(scores.strip("[]").split(", ")) == 2
    assert refused == "422 inputs[0]: empty or only whitespace"
