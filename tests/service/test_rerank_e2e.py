"""POST /v1/rerank (and /v2/rerank, where Cohere's v2 client posts) against the real server and the `ranker` test
bundle (tests/service/models_for_tests.py: the real encoder, its head fitted so that a document naming the city a
query asks about is relevant). The answers rank as the head was fitted, equal what the task layer itself answers on
ONNX Runtime, read a long document in windows, come back unchanged through the official `cohere` clients, and every
bad input gets its 4xx in berth's one error shape."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest

from tests.service.conftest import API_KEY
from tests.service.models_for_tests import CITIES, CITY_TEMPLATES, RANKER_SPEC, filler
from tests.service.test_service_overload import metric_value

MODEL = "ranker"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# (query, documents, the relevant one): only that document names the city the query asks about.
CASES = [
    ("Tell me about Lisbon.", ["We flew to Tokyo last week.", "The museum in Lisbon was closed.", filler(12, 7),
                               "Prices in Oslo keep rising."], 1),
    ("What is it like in Cairo?", ["Cairo is lovely in the spring.", "They opened an office in Dublin.",
                                   "The train from Berlin was late again."], 0),
    ("Which stories mention Toronto?", [filler(20, 8), "She was born in Vienna and moved away.",
                                        "After the meeting we drove back to Madrid.",
                                        "The museum in Toronto was closed."], 3),
]
QUERY, DOCUMENTS, RELEVANT = CASES[0]
ENDING = " ".join(template.format("Lisbon") for template in CITY_TEMPLATES[1:6])  # a passage about Lisbon
LONG = f"{filler(400, 11)} {ENDING}"  # the passage that counts is hundreds of tokens in


def rerank(client: httpx.Client, body: dict, route: str = "/v1/rerank") -> dict:
    response = client.post(route, json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    return response.json()


def refused(client: httpx.Client, body: dict, status: int) -> str:
    response = client.post("/v1/rerank", json={"model": MODEL, **body})
    assert response.status_code == status, response.text
    error = response.json()
    assert set(error) <= {"error", "error_type", "detail"}
    assert error["error_type"] == {413: "too_large", 422: "validation", 404: "not_found"}[status]
    return error["error"]


def window_tokens(tokenizer, query: str, document: str) -> int:
    """Tokens of [CLS] query [SEP] document [SEP] (a document that fits one window)."""
    return len(tokenizer.encode(query, document).ids)


# -- what the head was fitted to rank ------------------------------------------------------------------------------


@pytest.mark.parametrize("query,documents,relevant", CASES, ids=["lisbon", "cairo", "toronto"])
def test_the_document_naming_the_asked_city_ranks_first(client, tokenizer, query, documents, relevant):
    body = rerank(client, {"query": query, "documents": documents})
    results = body["results"]
    assert [r["index"] for r in results][0] == relevant
    assert sorted(r["index"] for r in results) == list(range(len(documents)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] > 0.5 > max(scores[1:]), scores  # relevant / not relevant, as fitted
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert all(r["truncated"] is False and "document" not in r for r in results)
    assert body["model"] == MODEL and uuid.UUID(body["id"])
    tokens = sum(window_tokens(tokenizer, query, d) for d in documents)  # one window each, the query in every one
    assert body["meta"] == {"tokens": {"input_tokens": tokens}} and body["usage"] == {"total_tokens": tokens}


def test_v2_path_and_fastapis_own_path_answer_alike(client):
    """/v2/rerank is the same endpoint; a body FastAPI parses (merge-patch+json) takes the routed path, not the
    fast path: the same rankings either way."""
    from service.fastpath import FastPath
    from service.routes import v1, v2

    assert {"/v1/rerank", "/v2/rerank"} <= set(FastPath(None, v1, v2).routes)
    body = {"model": MODEL, "query": QUERY, "documents": DOCUMENTS, "top_n": 3, "return_documents": True}
    fast = rerank(client, body)
    assert rerank(client, body, "/v2/rerank")["results"] == fast["results"]
    routed = client.post("/v1/rerank", content=json.dumps(body),
                         headers={"Content-Type": "application/merge-patch+json"})
    assert routed.status_code == 200, routed.text
    assert [r["index"] for r in routed.json()["results"]] == [r["index"] for r in fast["results"]]
    assert [r["relevance_score"] for r in routed.json()["results"]] == pytest.approx(
        [r["relevance_score"] for r in fast["results"]], abs=1e-5)


# -- the served answer is the task layer's own ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def task_layer(bundle_repository):
    """`definition.predict` of the ranker bundle on its own ONNX Runtime session: no HTTP, no batcher."""
    from tasks.bundle_checks import load_bundle
    from tasks.registry import definition
    from tasks.runtime.inference import offline_shape, run_items
    from tasks.runtime.onnx_session import create_session
    from tasks.runtime.tokenizer import load_tokenizer

    bundle = load_bundle(bundle_repository / MODEL, verify_hashes=True)
    spec = bundle.spec()
    assert spec.task == "rerank" and spec.max_seq_length == RANKER_SPEC.max_seq_length
    session, _ = create_session(bundle.model_path, bundle.precision, 2, prefer_gpu=False)
    feeds = [node.name for node in session.get_inputs()]

    def run(items, names, per_token):
        def forward(padded):
            return dict(zip(names, session.run(list(names), {name: padded[name] for name in feeds})))
        return run_items(forward, items, per_token, offline_shape(items, 8))

    tokenizer = load_tokenizer(bundle.tokenizer_path)

    def predict(query: str, documents: list[str], **options):
        from tasks.rerank import RerankInput, RerankOptions

        return definition("rerank").predict(tokenizer, spec, [RerankInput(query=query, documents=documents)], run,
                                            RerankOptions(**options))[0]

    return predict


OPTIONS = [{}, {"top_n": 2}, {"return_documents": True}, {"max_tokens_per_doc": 4, "return_documents": True},
           {"top_n": 1, "max_tokens_per_doc": 3}]


@pytest.mark.parametrize("options", OPTIONS, ids=[json.dumps(o) for o in OPTIONS])
def test_results_equal_the_task_layers_answer(client, task_layer, options):
    for query, documents, _ in [*CASES, (QUERY, [DOCUMENTS[0], LONG, DOCUMENTS[3]], 1)]:
        served = rerank(client, {"query": query, "documents": documents, **options})["results"]
        expected = task_layer(query, documents, **options)
        assert [{k: v for k, v in r.items() if k != "relevance_score"} for r in served] == \
            [{k: v for k, v in r.items() if k != "relevance_score"} for r in expected]
        assert [r["relevance_score"] for r in served] == pytest.approx([r["relevance_score"] for r in expected],
                                                                       abs=1e-5)


# -- options ------------------------------------------------------------------------------------------------------


def test_top_n_cuts_the_ranking_and_past_the_count_returns_all(client):
    full = rerank(client, {"query": QUERY, "documents": DOCUMENTS})["results"]
    assert rerank(client, {"query": QUERY, "documents": DOCUMENTS, "top_n": 2})["results"] == full[:2]
    assert rerank(client, {"query": QUERY, "documents": DOCUMENTS, "top_n": 1000})["results"] == full  # as Cohere
    assert "top_n" in refused(client, {"query": QUERY, "documents": DOCUMENTS, "top_n": 0}, 422)
    assert "top_n" in refused(client, {"query": QUERY, "documents": DOCUMENTS, "top_n": -3}, 422)


def test_return_documents_gives_each_text_back_from_strings_and_objects(client):
    mixed = [DOCUMENTS[0], {"text": DOCUMENTS[1]}, DOCUMENTS[2], {"text": DOCUMENTS[3]}]  # Jina's objects, mixed
    body = rerank(client, {"query": QUERY, "documents": mixed, "return_documents": True})
    assert [r["document"] for r in body["results"]] == [{"text": DOCUMENTS[r["index"]]} for r in body["results"]]
    plain = rerank(client, {"query": QUERY, "documents": DOCUMENTS})
    assert [(r["index"], r["relevance_score"]) for r in body["results"]] == \
        [(r["index"], r["relevance_score"]) for r in plain["results"]]


def test_a_long_document_is_read_in_windows_and_scored_by_its_best_window(client, tokenizer):
    documents = [DOCUMENTS[0], LONG, DOCUMENTS[3]]
    assert len(tokenizer.encode(LONG).ids) > 5 * RANKER_SPEC.max_seq_length  # the ending is many windows in
    body = rerank(client, {"query": QUERY, "documents": documents})
    first = body["results"][0]
    assert (first["index"], first["truncated"]) == (1, False) and first["relevance_score"] > 0.5
    assert body["meta"]["tokens"]["input_tokens"] > 5 * RANKER_SPEC.max_seq_length  # every window, the query in each
    # without its last passage, the same text is not relevant: a window at its end made the score
    without = rerank(client, {"query": QUERY, "documents": [LONG.removesuffix(ENDING)]})["results"][0]
    assert without["relevance_score"] < 0.5


def test_max_tokens_per_doc_cuts_and_says_so(client, tokenizer):
    documents = [DOCUMENTS[0], LONG, DOCUMENTS[3]]
    cut = 30
    body = rerank(client, {"query": QUERY, "documents": documents, "max_tokens_per_doc": cut})
    by_index = {r["index"]: r for r in body["results"]}
    assert by_index[1]["truncated"] is True and by_index[1]["relevance_score"] < 0.5  # its ending was cut off
    assert by_index[0]["truncated"] is False and by_index[2]["truncated"] is False  # shorter than the cut
    query = len(tokenizer.encode(QUERY, add_special_tokens=False).ids)
    assert body["meta"]["tokens"]["input_tokens"] == (window_tokens(tokenizer, QUERY, DOCUMENTS[0])
                                                      + query + cut + 3 + window_tokens(tokenizer, QUERY, DOCUMENTS[3]))


# -- bad input: a clear 4xx in the one error shape -------------------------------------------------------------------


def test_bad_documents_are_refused_naming_them(client):
    assert "documents: the list is empty" in refused(client, {"query": QUERY, "documents": []}, 422)
    assert "documents: 10000 in one request; the limit is 1000" in refused(
        client, {"query": QUERY, "documents": ["a short one"] * 10_000}, 413)
    assert "the limit is 1000" in refused(client, {"query": QUERY, "documents": ["a short one"] * 1001}, 413)
    assert refused(client, {"query": QUERY, "documents": ["fine", " \t "]}, 422).startswith(
        "documents[1]: empty or only whitespace")
    assert refused(client, {"query": "", "documents": ["fine"]}, 422).startswith("query: empty or only whitespace")
    assert "query" in refused(client, {"documents": ["fine"]}, 422)
    assert "documents.1" in refused(client, {"query": QUERY, "documents": ["fine", 5]}, 422)
    assert "documents.0.title" in refused(client, {"query": QUERY, "documents": [{"text": "x", "title": "y"}]}, 422)
    assert "rank_fields" in refused(client, {"query": QUERY, "documents": ["x"], "rank_fields": ["text"]}, 422)
    assert "max_tokens_per_doc" in refused(client, {"query": QUERY, "documents": ["x"], "max_tokens_per_doc": 0}, 422)


def test_a_model_of_another_task_or_an_unknown_one_is_refused(client):
    assert "/v1/classify" in refused(client, {"model": "sentiment", "query": QUERY, "documents": ["x"]}, 422)
    assert "rerank-v3.5" in refused(client, {"model": "rerank-v3.5", "query": QUERY, "documents": ["x"]}, 404)


def test_long_texts_meet_the_per_text_limits_and_the_budgets(client):
    huge = filler(20_000, 3)[:100_001]
    assert "documents[1]: 100001 characters; the limit is 100000 (max_chars_per_input)" in refused(
        client, {"query": QUERY, "documents": ["fine", huge]}, 413)
    # 100,000 characters are ~480 windows of 64 tokens: past the windows a request may add to one per document
    windows = refused(client, {"query": QUERY, "documents": ["fine", huge[:100_000]]}, 413)
    assert "one window per document + max_items_per_request" in windows and "max_tokens_per_doc" in windows
    cut = rerank(client, {"query": QUERY, "documents": ["fine", huge[:100_000]], "max_tokens_per_doc": 2000})
    assert {r["index"]: r["truncated"] for r in cut["results"]} == {0: False, 1: True}
    assert "max_chars_per_request" in refused(client, {"query": QUERY, "documents": [huge[:90_000]] * 3}, 413)
    long_query = " ".join(["where"] * 70)
    assert "query is 70 tokens long" in refused(client, {"query": long_query, "documents": ["x"]}, 413)


def test_the_token_budget_counts_the_query_in_every_window(client, tokenizer):
    documents = [" ".join(["a"] * 20) for _ in range(600)]  # 20 tokens each
    query = " ".join(["b"] * 40)  # 40 tokens: 600 x (40 + 20 + 3) = 37,800 tokens > 32,768
    assert window_tokens(tokenizer, query, documents[0]) == 63
    assert "the request makes 37800 tokens" in refused(client, {"query": query, "documents": documents}, 413)
    short = rerank(client, {"query": "b", "documents": documents})  # 600 x 24 tokens fit
    assert short["meta"]["tokens"]["input_tokens"] == 600 * 24


def test_without_the_api_key_both_paths_are_401(server):
    for route in ("/v1/rerank", "/v2/rerank"):
        response = httpx.post(server.url + route, json={"model": MODEL, "query": QUERY, "documents": ["x"]})
        assert response.status_code == 401 and response.json()["error_type"] == "unauthorized"


# -- a thousand documents and a small request at once ---------------------------------------------------------------


def test_a_thousand_documents_do_not_starve_a_small_request(server):
    """1,000 documents (1,000 model items, ~60 forward passes here) are ranked while small rerank requests of
    another client arrive: each is answered while the large one is still running (the batcher takes one item per
    request in turn), and the large one finds its one relevant document among 999."""
    others = [template.format(city) for city in CITIES if city != "Lisbon" for template in CITY_TEMPLATES]
    documents = [others[i % len(others)] if i % 3 else filler(10 + i % 20, i) for i in range(1000)]
    documents[737] = "The museum in Lisbon was closed."
    small = {"model": MODEL, "query": "What is it like in Cairo?", "documents": CASES[1][1]}

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=300, headers=AUTH) as c:
            large = asyncio.ensure_future(c.post("/v1/rerank", json={"model": MODEL, "query": QUERY,
                                                                     "documents": documents, "top_n": 3}))
            while metric_value(server.url, "berth_queue_depth", model=MODEL) < 200:  # the large one is queued
                assert not large.done(), large.result().text
                await asyncio.sleep(0.01)
            smalls = []
            for _ in range(3):
                response = await c.post("/v1/rerank", json=small)
                smalls.append((response, large.done()))
            return await large, smalls

    large, smalls = asyncio.run(scenario())
    assert large.status_code == 200, large.text
    assert large.json()["results"][0]["index"] == 737
    for response, large_done in smalls:
        assert response.status_code == 200 and response.json()["results"][0]["index"] == 0
        assert not large_done, "a small request was answered only after the large one"


# -- the official cohere clients -------------------------------------------------------------------------------------


def test_cohere_v2_client_reads_the_answer_unchanged(server):
    cohere = pytest.importorskip("cohere")
    co = cohere.ClientV2(base_url=server.url, api_key=API_KEY)  # posts to /v2/rerank
    raw = co.with_raw_response.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=3)
    sent = raw.response.json()
    assert raw.response.status_code == 200 and [r["index"] for r in sent["results"]][0] == RELEVANT
    read = raw.data
    assert read.id == sent["id"]
    assert [(r.index, r.relevance_score) for r in read.results] == [(r["index"], r["relevance_score"])
                                                                    for r in sent["results"]]
    assert [r.truncated for r in read.results] == [False] * 3  # berth's extra fields stay readable
    assert read.meta.tokens.input_tokens == sent["meta"]["tokens"]["input_tokens"]
    plain = co.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [(r.index, r.relevance_score) for r in plain.results] == [(r.index, r.relevance_score) for r in read.results]
    with pytest.raises(cohere.errors.UnprocessableEntityError) as error:
        co.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=0)
    assert error.value.body["error_type"] == "validation" and "top_n" in error.value.body["error"]


def test_cohere_v1_client_with_return_documents(server):
    cohere = pytest.importorskip("cohere")
    co = cohere.Client(base_url=server.url, api_key=API_KEY)  # posts to /v1/rerank
    answer = co.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=2, return_documents=True)
    assert [r.index for r in answer.results][0] == RELEVANT
    assert [r.document.text for r in answer.results] == [DOCUMENTS[r.index] for r in answer.results]
