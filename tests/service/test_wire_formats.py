"""The wire formats of other servers, spoken by their own clients against the real server (service/compat):

- the Hugging Face Inference API at /models/{name}: `huggingface_hub.InferenceClient` pointed at a model's URL,
  each task method's answer equal to berth's own /v1 route's for the same inputs;
- OpenAI's /v1/embeddings with token-id inputs: the official `openai` client, ids from transformers' tokenizer,
  equal to the texts' embeddings;
- text-embeddings-inference's routes: every answer and error checked against the fields and types TEI's
  published OpenAPI document declares (tests/service/data/tei_openapi_extract.json), and against /v1's answers.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import API_KEY, ServerProcess

AUTH = {"Authorization": f"Bearer {API_KEY}"}
SENTENCES = ["A man is playing a guitar.", "Someone plays an instrument.", "A chef is cooking pasta in the kitchen."]
NER_TEXT = "Peter Blackburn met officials in Geneva and flew on to London and Berlin last week."
QUESTION = {"question": "When was the company founded?",
            "context": "The company was founded in 1843 by Ada Lovelace. It moved to Paris in 1901."}
LONG = " ".join(["the old market by the river was quiet in the morning light"] * 40)  # ~480 tokens


def post(client: httpx.Client, route: str, body: dict) -> Any:
    response = client.post(route, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def without_truncation(result: Any) -> Any:
    if isinstance(result, list):
        return [without_truncation(r) for r in result]
    return {k: v for k, v in result.items() if k not in ("truncated", "truncated_tokens")}


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


# -- the Hugging Face Inference API ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf():
    hub = pytest.importorskip("huggingface_hub")

    def client(server: ServerProcess, name: str, **kwargs):
        return hub.InferenceClient(model=f"{server.url}/models/{name}", token=API_KEY, timeout=120, **kwargs)

    return client


def test_hf_feature_extraction_equals_v1_embed(server, client, hf):
    served = post(client, "/v1/embed", {"model": "embeddings", "inputs": SENTENCES})["results"]
    one = hf(server, "embeddings").feature_extraction(SENTENCES[0])
    assert one.shape == (384,) and one.dtype == np.float32
    np.testing.assert_allclose(one, served[0]["embedding"], atol=1e-6)
    many = hf(server, "embeddings").feature_extraction(SENTENCES)
    np.testing.assert_allclose(many, [r["embedding"] for r in served], atol=1e-6)

    raw = post(client, "/v1/embed", {"model": "embeddings", "inputs": SENTENCES, "normalize": False})["results"]
    from huggingface_hub import InferenceClient  # base_url=, as the client's OpenAI-style alias of model=

    unnormalized = InferenceClient(base_url=f"{server.url}/models/embeddings", api_key=API_KEY).feature_extraction(
        SENTENCES, normalize=False)
    np.testing.assert_allclose(unnormalized, [r["embedding"] for r in raw], rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.linalg.norm(unnormalized, axis=1), 1.0, atol=1e-3)


def test_hf_feature_extraction_cuts_only_when_asked(server, client, hf):
    from huggingface_hub.errors import HfHubHTTPError

    with pytest.raises(HfHubHTTPError) as refused:
        hf(server, "embeddings").feature_extraction(LONG)
    assert refused.value.response.status_code == 413
    assert "truncate" in refused.value.response.json()["error"]
    cut = hf(server, "embeddings").feature_extraction(LONG, truncate=True, truncation_direction="right")
    served = post(client, "/v1/embed", {"model": "embeddings", "inputs": LONG})["results"][0]
    assert served["truncated"]
    np.testing.assert_allclose(cut, served["embedding"], atol=1e-6)


def test_hf_sentence_similarity_equals_v1_similarity(server, client, hf):
    scores = hf(server, "embeddings").sentence_similarity(SENTENCES[0], SENTENCES[1:])
    served = post(client, "/v1/similarity", {"model": "embeddings", "inputs": {"source": SENTENCES[0],
                                                                               "targets": SENTENCES[1:]}})
    assert isinstance(scores, list) and len(scores) == 2
    np.testing.assert_allclose(scores, served["results"][0], atol=1e-6)
    # the task named in the path, as the Hugging Face router names it
    named = post(client, "/models/embeddings/pipeline/sentence-similarity",
                 {"inputs": {"source_sentence": SENTENCES[0], "sentences": SENTENCES[1:]}})
    np.testing.assert_allclose(named, scores, atol=1e-6)


def test_hf_text_classification_equals_v1_classify(server, client, hf):
    model = next(m for m in client.get("/v1/models").json()["models"] if m["name"] == "sentiment")
    labels = model["labels"]
    text = "A gorgeous, witty, seductive movie."
    ranked = hf(server, "sentiment").text_classification(text)
    served = post(client, "/v1/classify", {"model": "sentiment", "inputs": text, "top_k": len(labels)})["results"][0]
    assert [(e.label, e.score) for e in ranked] == [(e["label"], e["score"]) for e in served]
    best = hf(server, "sentiment").text_classification(text, top_k=1)
    assert [(e.label, e.score) for e in best] == [(served[0]["label"], served[0]["score"])]

    logits = hf(server, "sentiment").text_classification(text, function_to_apply="none")
    by_label = {e.label: e.score for e in logits}
    probabilities = softmax(np.array([by_label[label] for label in labels]))
    np.testing.assert_allclose([probabilities[labels.index(e["label"])] for e in served],
                               [e["score"] for e in served], atol=1e-6)
    sigmoids = hf(server, "sentiment").text_classification(text, function_to_apply="sigmoid")
    np.testing.assert_allclose([e.score for e in sigmoids], [1 / (1 + np.exp(-by_label[e.label])) for e in sigmoids],
                               atol=1e-6)

    # a list of texts: a ranked list per text
    both = post(client, "/models/sentiment", {"inputs": [text, "Dull."], "parameters": {"top_k": 1}})
    assert len(both) == 2 and both[0] == [{"label": served[0]["label"], "score": served[0]["score"]}]


def test_hf_text_classification_of_pairs_equals_v1_pair(server, client, hf):
    from huggingface_hub.errors import HfHubHTTPError

    pair = {"text": "A dog runs on the beach.", "text_pair": "A dog is running along the shore."}
    answer = post(client, "/models/similarity", {"inputs": pair})
    served = post(client, "/v1/pair", {"model": "similarity", "inputs": pair})["results"][0]
    assert answer == [[{"label": "LABEL_0", "score": served["score"]}]]  # regression: the raw score, as transformers
    with pytest.raises(HfHubHTTPError) as refused:
        hf(server, "similarity").text_classification("only one text")
    assert refused.value.response.status_code == 422 and "text_pair" in refused.value.response.json()["error"]


@pytest.mark.parametrize("strategy", [None, "simple", "first", "average", "max", "none"])
def test_hf_token_classification_equals_v1_ner(server, client, hf, strategy):
    entities = hf(server, "entities").token_classification(NER_TEXT, aggregation_strategy=strategy)
    served = post(client, "/v1/ner", {"model": "entities", "inputs": NER_TEXT,
                                      "aggregation": strategy or "simple"})["results"][0]
    assert served, "the test model finds the cities"
    key = "entity" if strategy == "none" else "entity_group"
    assert [(getattr(e, key), e.word, e.start, e.end, e.score) for e in entities] == \
        [(e["entity"], e["text"], e["start"], e["end"], e["score"]) for e in served]
    assert all(NER_TEXT[e.start:e.end] == e.word for e in entities)


def test_hf_question_answering_equals_v1_qa(server, client, hf):
    answer = hf(server, "reader").question_answering(**QUESTION)
    served = post(client, "/v1/qa", {"model": "reader", "inputs": QUESTION})["results"][0]
    assert (answer.answer, answer.score, answer.start, answer.end) == \
        (served["answer"], served["score"], served["start"], served["end"])
    assert QUESTION["context"][answer.start:answer.end] == answer.answer
    ranked = hf(server, "reader").question_answering(**QUESTION, top_k=2, max_answer_len=10)
    served = post(client, "/v1/qa", {"model": "reader", "inputs": QUESTION, "top_k": 2,
                                     "max_answer_length": 10})["results"][0]
    assert [(a.answer, a.score, a.start, a.end) for a in ranked] == \
        [(a["answer"], a["score"], a["start"], a["end"]) for a in served]


@pytest.mark.parametrize("text", ["Paris is the [MASK] of France.", "The [MASK] sat on the [MASK]."])
def test_hf_fill_mask_equals_v1_fill_mask(server, client, hf, text):
    filled = hf(server, "masker").fill_mask(text, top_k=3)
    served = post(client, "/v1/fill-mask", {"model": "masker", "inputs": text, "top_k": 3})["results"][0]

    def plain(element: Any) -> Any:
        if isinstance(element, list):
            return [plain(e) for e in element]
        return {"score": element.score, "token": element.token, "token_str": element.token_str,
                "sequence": element.sequence}

    assert plain(filled) == served


def test_hf_errors_come_back_to_the_client(server, client, hf):
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import HfHubHTTPError

    def refusal(call) -> tuple[int, dict]:
        with pytest.raises(HfHubHTTPError) as raised:
            call()
        return raised.value.response.status_code, raised.value.response.json()

    status, body = refusal(lambda: hf(server, "no-such-model").text_classification("x"))
    assert status == 404 and body["error_type"] == "not_found" and "no-such-model" in body["error"]
    status, body = refusal(lambda: hf(server, "sentiment").question_answering(**QUESTION))
    assert status == 422 and "question-answering" in body["error"]
    status, body = refusal(lambda: hf(server, "embeddings").question_answering(**QUESTION))
    assert status == 422 and "question-answering" in body["error"]
    status, body = refusal(lambda: hf(server, "chooser").text_classification("x"))
    assert status == 422 and "/v1/choice" in body["error"]
    status, body = refusal(lambda: hf(server, "embeddings").feature_extraction("x", prompt_name="query"))
    assert status == 422 and "prompt_name" in body["error"]
    status, body = refusal(lambda: hf(server, "masker").fill_mask("a [MASK].", targets=["b"]))
    assert status == 422 and "targets" in body["error"]
    status, body = refusal(lambda: hf(server, "masker").fill_mask("no mask here"))
    assert status == 422 and "[MASK]" in body["error"]
    status, body = refusal(lambda: InferenceClient(model=f"{server.url}/models/sentiment").text_classification("x"))
    assert status == 401 and body["error_type"] == "unauthorized"
    wrong = client.post("/models/sentiment/pipeline/fill-mask", json={"inputs": "a [MASK]."})
    assert wrong.status_code == 422 and "text-classification" in wrong.json()["error"]
    malformed = client.post("/models/sentiment", content=b"{not json", headers={"content-type": "application/json"})
    assert malformed.status_code == 400 and malformed.json()["error_type"] == "validation"


def test_hf_requests_are_counted_under_the_route_template(server, client):
    post(client, "/models/sentiment", {"inputs": "counted"})
    httpx.post(f"{server.url}/models/made-up-{id(client)}", json={"inputs": "x"})  # 401 before routing
    text = client.get("/metrics").text
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "berth_requests_total"]
    routes = {s.labels["route"] for s in samples}
    assert "/models/{name}" in routes
    assert not any(r.startswith("/models/") and r != "/models/{name}" and "pipeline" not in r for r in routes)
    assert any(s.labels["route"] == "/models/{name}" and s.labels["model"] == "sentiment"
               and s.labels["status"] == "200" for s in samples)
    assert any(s.labels["route"] == "/models/{name}" and s.labels["status"] == "401" for s in samples)


# -- OpenAI's embeddings with token ids ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_tokenizer(base_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(base_path))


def test_openai_token_id_inputs_equal_the_texts_embeddings(server, bert_tokenizer):
    openai = pytest.importorskip("openai")
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    ids = [bert_tokenizer(s, add_special_tokens=False)["input_ids"] for s in SENTENCES]
    texts = api.embeddings.create(model="embeddings", input=SENTENCES)
    as_ids = api.embeddings.create(model="embeddings", input=ids)
    np.testing.assert_allclose([d.embedding for d in as_ids.data], [d.embedding for d in texts.data], atol=1e-6)
    assert as_ids.usage.prompt_tokens == texts.usage.prompt_tokens == sum(len(i) + 2 for i in ids)
    one = api.embeddings.create(model="embeddings", input=ids[0], encoding_format="float")  # one flat list: one input
    assert len(one.data) == 1
    np.testing.assert_allclose(one.data[0].embedding, texts.data[0].embedding, atol=1e-6)

    with pytest.raises(openai.UnprocessableEntityError) as bad:
        api.embeddings.create(model="embeddings", input=[[ids[0][0], 30522]])
    message = bad.value.response.json()["error"]  # berth's error shape (the client shows only the status)
    assert "input[0][1]" in message and "30522" in message


def test_openai_token_ids_follow_the_texts_truncation_rules(server, client, bert_tokenizer):
    openai = pytest.importorskip("openai")
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    ids = bert_tokenizer(LONG, add_special_tokens=False)["input_ids"]
    assert len(ids) + 2 > 256
    with pytest.raises(openai.BadRequestError) as refused:
        api.embeddings.create(model="embeddings", input=[ids])
    assert f"{len(ids) + 2} tokens" in refused.value.response.json()["error"]
    cut = api.embeddings.create(model="embeddings", input=[ids], encoding_format="float", extra_body={"truncate": True})
    text = post(client, "/v1/embeddings", {"model": "embeddings", "input": LONG, "truncate": True})["data"][0]
    assert cut.data[0].model_extra["truncated_tokens"] == text["truncated_tokens"] == len(ids) + 2 - 256
    np.testing.assert_allclose(cut.data[0].embedding, text["embedding"], atol=1e-6)
    empty = client.post("/v1/embeddings", json={"model": "embeddings", "input": [[]]})
    assert empty.status_code == 422 and "input[0]" in empty.json()["error"]


# -- text-embeddings-inference ------------------------------------------------------------------------------------

EXTRACT = json.loads((Path(__file__).parent / "data" / "tei_openapi_extract.json").read_text())


def _as_json_schema(node: Any) -> Any:
    """OpenAPI 3.0's `nullable` as JSON Schema's null type; everything else is JSON Schema already."""
    if isinstance(node, list):
        return [_as_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _as_json_schema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


COMPONENTS = _as_json_schema(EXTRACT["components"])


def assert_declared(payload: Any, schema: dict) -> None:
    from jsonschema import Draft202012Validator

    Draft202012Validator({**copy.deepcopy(_as_json_schema(schema)), "components": COMPONENTS}).validate(payload)


def assert_answer(response: httpx.Response, path: str, status: int = 200, method: str = "post") -> Any:
    """The response has `status` and the body TEI's document declares for it."""
    assert response.status_code == status, response.text
    operation = EXTRACT["paths"][path][method]
    assert_declared(response.json(), operation["responses"][str(status)]["content"]["application/json"]["schema"])
    return response.json()


def assert_tei_request(path: str, body: dict) -> dict:
    """A body TEI's document accepts for `path` (so what is sent is what a TEI client may send)."""
    assert_declared(body, EXTRACT["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"])
    return body


def assert_tei_error(response: httpx.Response, status: int, *words: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"}
    assert_declared(body, {"$ref": "#/components/schemas/ErrorResponse"})
    for word in words:
        assert word in body["error"], body["error"]
    return body["error_type"]


@pytest.fixture(scope="module")
def tei_server(bundle_repository, tmp_path_factory):
    """The embeddings, two predict candidates (the setting names one) and the ranker when the repository has it."""
    names = [n for n in ("embeddings", "sentiment", "similarity", "ranker")
             if (bundle_repository / n / "bundle.json").is_file()]
    proc = ServerProcess(bundle_repository, tmp_path_factory.mktemp("logs") / "tei.log",
                         env={"BERTH_API_KEY": API_KEY, "BERTH_MODEL_NAMES": ",".join(names),
                              "BERTH_TEI_PREDICT_MODEL": "sentiment"})
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def tei(tei_server):
    with httpx.Client(base_url=tei_server.url, timeout=120, headers=AUTH) as c:
        yield c


def test_tei_embed_is_declared_and_equals_v1_embed(tei):
    body = assert_tei_request("/embed", {"inputs": SENTENCES, "truncate": False, "truncation_direction": "Right"})
    vectors = assert_answer(tei.post("/embed", json=body), "/embed")
    served = post(tei, "/v1/embed", {"model": "embeddings", "inputs": SENTENCES})["results"]
    np.testing.assert_allclose(vectors, [r["embedding"] for r in served], atol=1e-6)
    one = assert_answer(tei.post("/embed", json={"inputs": SENTENCES[0]}), "/embed")
    assert len(one) == 1
    np.testing.assert_allclose(one[0], vectors[0], atol=1e-6)
    raw = assert_answer(tei.post("/embed", json={"inputs": SENTENCES, "normalize": False}), "/embed")
    unnormalized = post(tei, "/v1/embed", {"model": "embeddings", "inputs": SENTENCES, "normalize": False})["results"]
    np.testing.assert_allclose(raw, [r["embedding"] for r in unnormalized], rtol=1e-5, atol=1e-6)


def test_tei_embed_takes_token_ids_as_tei_does(tei, bert_tokenizer):
    ids = [bert_tokenizer(s, add_special_tokens=False)["input_ids"] for s in SENTENCES[:2]]
    texts = assert_answer(tei.post("/embed", json={"inputs": SENTENCES[:2]}), "/embed")
    mixed = assert_answer(tei.post("/embed", json=assert_tei_request("/embed", {"inputs": [ids[0], SENTENCES[1]]})),
                          "/embed")
    flat = assert_answer(tei.post("/embed", json={"inputs": ids[1]}), "/embed")
    np.testing.assert_allclose(mixed, texts, atol=1e-6)
    np.testing.assert_allclose(flat, texts[1:], atol=1e-6)
    assert assert_tei_error(tei.post("/embed", json={"inputs": [[101, 40000]]}), 422, "inputs[0][1]",
                            "40000") == "Validation"


def test_tei_embed_texts_and_token_ids_share_one_character_budget(tei):
    """120,000 characters of text and 100,000 token ids: each under max_chars_per_request (200,000), together over."""
    text = "word " * 12_000
    ids = [2773] * 50_000
    response = tei.post("/embed", json={"inputs": [text, text, ids, ids], "truncate": True})
    assert assert_tei_error(response, 413, "200000", "max_chars_per_request") == "Validation"


def test_tei_embed_refuses_what_is_too_long_unless_asked_to_cut(tei):
    assert assert_tei_error(tei.post("/embed", json={"inputs": [SENTENCES[0], LONG]}), 413, "inputs[1]",
                            "truncate") == "Validation"
    cut = assert_answer(tei.post("/embed", json={"inputs": LONG, "truncate": True}), "/embed")
    served = post(tei, "/v1/embed", {"model": "embeddings", "inputs": LONG})["results"][0]
    np.testing.assert_allclose(cut[0], served["embedding"], atol=1e-6)
    assert_tei_error(tei.post("/embed", json={"inputs": LONG, "truncate": True, "truncation_direction": "left"}),
                     422, "truncation_direction")


def test_tei_embed_all_is_every_tokens_vector(tei):
    answer = assert_answer(tei.post("/embed_all", json=assert_tei_request("/embed_all", {"inputs": SENTENCES[:2]})),
                           "/embed_all")
    served = post(tei, "/v1/embed", {"model": "embeddings", "inputs": SENTENCES[:2], "output": "tokens"})["results"]
    for per_token, result in zip(answer, served):
        assert len(per_token) == len(result["tokens"]) + 2  # [CLS] and [SEP] too
        np.testing.assert_allclose(per_token[1:-1], [t["embedding"] for t in result["tokens"]], atol=1e-5)
    assert_tei_error(tei.post("/embed_all", json={"inputs": ["x"] * 17}), 413, "16")


def test_tei_predict_is_declared_and_equals_v1_classify(tei):
    labels = next(m for m in tei.get("/v1/models").json()["models"] if m["name"] == "sentiment")["labels"]
    texts = ["A gorgeous, witty, seductive movie.", "Unflinchingly bleak and desperate."]
    served = post(tei, "/v1/classify", {"model": "sentiment", "inputs": texts, "top_k": len(labels)})["results"]
    one = assert_answer(tei.post("/predict", json=assert_tei_request("/predict", {"inputs": texts[0]})), "/predict")
    assert one == without_truncation(served[0])
    batch = assert_answer(tei.post("/predict", json=assert_tei_request("/predict", {"inputs": [[t] for t in texts]})),
                          "/predict")
    assert batch == without_truncation(served)
    raw = assert_answer(tei.post("/predict", json={"inputs": texts[0], "raw_scores": True}), "/predict")
    logits = np.array([next(p["score"] for p in raw if p["label"] == label) for label in labels])
    np.testing.assert_allclose(softmax(logits), [next(p["score"] for p in one if p["label"] == label)
                                                  for label in labels], atol=1e-6)
    assert_tei_error(tei.post("/predict", json={"inputs": ["a text", "its pair"]}), 422, "sentiment", "pair")
    assert_tei_error(tei.post("/predict", json={"inputs": [["a", "b", "c"]]}), 422, "inputs[0]")


def test_tei_rerank_is_declared_and_equals_v1_rerank(tei, tei_server):
    models = {m["name"]: m["task"] for m in tei.get("/v1/models").json()["models"]}
    if "rerank" not in models.values():
        pytest.skip("the test repository has no rerank bundle (an older BERTH_TEST_REPOSITORY: rebuild it)")
    name = next(n for n, task in models.items() if task == "rerank")
    query = "Tell me about Lisbon."
    texts = ["We flew to Tokyo last week.", "The museum in Lisbon was closed.", "Prices in Oslo keep rising."]
    body = assert_tei_request("/rerank", {"query": query, "texts": texts, "return_text": True})
    ranks = assert_answer(tei.post("/rerank", json=body), "/rerank")
    served = post(tei, "/v1/rerank", {"model": name, "query": query, "documents": texts})["results"]
    assert [(r["index"], r["score"]) for r in ranks] == [(r["index"], r["relevance_score"]) for r in served]
    assert [r["text"] for r in ranks] == [texts[r["index"]] for r in ranks]
    raw = assert_answer(tei.post("/rerank", json={"query": query, "texts": texts, "raw_scores": True}), "/rerank")
    assert [r["index"] for r in raw] == [r["index"] for r in ranks] and all("text" not in r for r in raw)
    np.testing.assert_allclose([1 / (1 + np.exp(-r["score"])) for r in raw], [r["score"] for r in ranks], atol=1e-6)


def test_tei_tokenize_gives_the_models_tokens_with_byte_offsets(tei, bert_tokenizer):
    texts = ["Héllo wörld, naïve café!", "Tim Cook visited Berlin."]
    answer = assert_answer(tei.post("/tokenize", json=assert_tei_request("/tokenize", {"inputs": texts})),
                           "/tokenize")
    for text, tokens in zip(texts, answer):
        assert [t["id"] for t in tokens] == bert_tokenizer(text)["input_ids"]
        assert [t["special"] for t in tokens] == [True] + [False] * (len(tokens) - 2) + [True]
        assert tokens[0]["start"] is None and tokens[0]["text"] == "[CLS]"
        for token in tokens[1:-1]:  # TEI's offsets are UTF-8 byte offsets into the input
            assert text.encode()[token["start"]:token["stop"]].decode() == token["text"]
    plain = assert_answer(tei.post("/tokenize", json={"inputs": texts[1], "add_special_tokens": False}), "/tokenize")
    assert [t["id"] for t in plain[0]] == bert_tokenizer(texts[1], add_special_tokens=False)["input_ids"]
    assert_tei_error(tei.post("/tokenize", json={"inputs": ""}), 422, "empty")


def test_tei_decode_equals_the_tokenizer(tei, bert_tokenizer):
    ids = [bert_tokenizer(s)["input_ids"] for s in SENTENCES[:2]]
    texts = assert_answer(tei.post("/decode", json=assert_tei_request("/decode", {"ids": ids})), "/decode")
    assert texts == [bert_tokenizer.decode(i, skip_special_tokens=True) for i in ids]
    kept = assert_answer(tei.post("/decode", json={"ids": ids[0], "skip_special_tokens": False}), "/decode")
    assert kept == [bert_tokenizer.decode(ids[0])]
    assert_tei_error(tei.post("/decode", json={"ids": [101, 99999]}), 422, "ids[0][1]", "99999")


def test_tei_info_is_declared(tei):
    info = assert_answer(tei.get("/info"), "/info", method="get")
    assert info["model_id"] == "embeddings" and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 256 and info["max_client_batch_size"] == 64
    assert info["model_dtype"] == "float32" and info["auto_truncate"] is False


def test_tei_errors_have_teis_shape_wherever_they_are_raised(tei, tei_server):
    assert assert_tei_error(httpx.post(tei_server.url + "/embed", json={"inputs": "x"}), 401, "API key") \
        == "Validation"  # the request guard, before the route
    assert_tei_error(tei.post("/embed", json={"inputs": "x", "unknown": 1}), 422, "unknown")
    assert_tei_error(tei.post("/embed", json={"inputs": []}), 422, "empty")
    assert_tei_error(tei.post("/embed", json={"inputs": "x", "prompt_name": "query"}), 422, "prompt_name")
    assert_tei_error(tei.post("/embed", content=b"{oops", headers={"content-type": "application/json"}), 400)
    huge = {"inputs": "x" * (4 * 1024 * 1024 + 1)}
    assert_tei_error(tei.post("/embed", json=huge), 413, "max_body_bytes")
    # routing's own errors, raised before any route's handler: a wrong method, a boolean that is not one
    assert assert_tei_error(tei.get("/embed"), 405, "GET") == "Validation"
    assert_tei_error(tei.post("/embed", json={"inputs": "x", "normalize": "false"}), 422, "normalize")
    assert_tei_error(tei.post("/embed", json={"inputs": ["x", "\u200b"]}), 422, "inputs[1]", "no text")


def test_tei_routes_without_a_setting_take_the_one_model_or_say_which_setting(client, server):
    """The main server: one embedding model (taken), several classification/pair models (424 naming the setting)."""
    assert assert_answer(client.post("/embed", json={"inputs": "one model"}), "/embed")
    error_type = assert_tei_error(client.post("/predict", json={"inputs": "x"}), 424, "tei_predict_model",
                                  "BERTH_TEI_PREDICT_MODEL", "sentiment", "similarity")
    assert error_type == "Backend"


@pytest.fixture(scope="module")
def pair_server(bundle_repository, tmp_path_factory):
    proc = ServerProcess(bundle_repository, tmp_path_factory.mktemp("logs") / "tei-pair.log",
                         env={"BERTH_MODEL_NAMES": "similarity"})
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def test_tei_predict_of_pairs_on_the_one_pair_model(pair_server):
    with httpx.Client(base_url=pair_server.url, timeout=120) as c:
        pairs = [["A dog runs on the beach.", "A dog is running along the shore."], ["A man eats.", "Stocks fell."]]
        one = assert_answer(c.post("/predict", json=assert_tei_request("/predict", {"inputs": pairs[0]})), "/predict")
        batch = assert_answer(c.post("/predict", json={"inputs": pairs}), "/predict")
        served = post(c, "/v1/pair", {"inputs": [{"text": a, "text_pair": b} for a, b in pairs]})["results"]
        assert one == [{"label": "LABEL_0", "score": served[0]["score"]}]
        assert batch == [[{"label": "LABEL_0", "score": r["score"]}] for r in served]
        assert_tei_error(c.post("/predict", json={"inputs": "one text"}), 422, "pair")
        assert_tei_error(c.post("/embed", json={"inputs": "x"}), 424, "no embedding model")
        info = assert_answer(c.get("/info"), "/info", method="get")  # no embedding model: the predict model
        assert info["model_id"] == "similarity" and info["model_type"] == {
            "reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}  # one output, as TEI names it
