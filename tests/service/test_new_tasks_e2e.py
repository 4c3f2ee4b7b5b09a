"""The encoder's other uses, served over real HTTP and checked against independent implementations on the
same checkpoints: sentence-transformers (embeddings, similarity), the official `openai` client
(/v1/embeddings), transformers' fill-mask pipeline and transformers' BertForMultipleChoice."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.service.conftest import API_KEY

SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays an instrument on the stage.",
    "The European Commission said on Thursday it disagreed with German advice to consumers.",
    "Tokyo's cherry blossoms bloomed early this year — über schön!",
    "short",
    "It's slow -- very, very slow.",
]


@pytest.fixture(scope="module")
def st_model(base_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    torch.set_num_threads(2)
    return sentence_transformers.SentenceTransformer(str(base_path), device="cpu")


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def post(client, route: str, body: dict) -> dict:
    response = client.post(route, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_embed_equals_sentence_transformers(client, st_model):
    body = post(client, "/v1/embed", {"inputs": SENTENCES})
    assert body["model"] == "embeddings" and len(body["results"]) == len(SENTENCES)
    served = np.array([r["embedding"] for r in body["results"]], dtype=np.float32)
    expected = st_model.encode(SENTENCES, convert_to_numpy=True)  # the folder's Normalize module: unit vectors
    assert served.shape == expected.shape == (len(SENTENCES), 384)
    assert cosines(served, expected).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)  # normalized by default
    raw = np.array([r["embedding"] for r in post(client, "/v1/embed", {"inputs": SENTENCES[:2],
                                                                       "normalize": False})["results"]])
    assert abs(np.linalg.norm(raw[0]) - 1.0) > 0.01 and cosines(raw, expected[:2]).min() >= 0.99999
    single = post(client, "/v1/embed", {"inputs": SENTENCES[0]})["results"]
    assert len(single) == 1 and single[0]["truncated"] is False


def test_embed_truncates_as_sentence_transformers_does(client, st_model):
    long_text = " ".join(["the quiet river runs past the old mill"] * 60)  # ~480 tokens; the model takes 256
    result = post(client, "/v1/embed", {"inputs": long_text})["results"][0]
    assert result["truncated"] is True
    expected = st_model.encode([long_text], convert_to_numpy=True)
    assert cosines(np.array([result["embedding"]]), expected)[0] >= 0.99999
    refused = client.post("/v1/embed", json={"inputs": long_text, "truncate": False})
    assert refused.status_code == 413 and refused.json()["error_type"] == "too_large"


def test_token_vectors_concatenate_the_asked_layers_with_offsets(client, base_path):
    from transformers import AutoModel, AutoTokenizer

    text = "Tim Cook visited Berlin's museums."
    body = post(client, "/v1/embed", {"inputs": text, "output": "tokens", "layers": [-1, -2, -3, -4]})
    tokens = body["results"][0]["tokens"]
    hf_tokenizer = AutoTokenizer.from_pretrained(str(base_path))
    encoding = hf_tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
    with torch.no_grad():
        states = AutoModel.from_pretrained(str(base_path))(
            input_ids=encoding["input_ids"], attention_mask=encoding["attention_mask"],
            output_hidden_states=True).hidden_states  # 7 x (1, T, 384)
    expected = torch.cat([states[i][0] for i in (-1, -2, -3, -4)], dim=-1)[1:-1].numpy()  # no [CLS]/[SEP]
    offsets = encoding["offset_mapping"][0][1:-1].tolist()
    assert [t["token"] for t in tokens] == hf_tokenizer.convert_ids_to_tokens(encoding["input_ids"][0][1:-1])
    assert [(t["start"], t["end"]) for t in tokens] == [tuple(o) for o in offsets]
    assert "".join(text[t["start"] : t["end"]] for t in tokens[:2]) == "TimCook"
    served = np.array([t["embedding"] for t in tokens])
    assert served.shape == (len(offsets), 4 * 384)
    np.testing.assert_allclose(served, expected, atol=1e-4)


def test_similarity_equals_sentence_transformers_cosines(client, st_model):
    source, targets = SENTENCES[0], SENTENCES[1:]
    body = post(client, "/v1/similarity", {"inputs": [{"source": source, "targets": targets},
                                                      {"source": targets[0], "targets": [source]}]})
    vectors = st_model.encode([source, *targets], convert_to_numpy=True)
    expected = vectors[1:] @ vectors[0]
    np.testing.assert_allclose(body["results"][0], expected, atol=1e-5)
    np.testing.assert_allclose(body["results"][1], expected[:1], atol=1e-5)
    assert int(np.argmax(body["results"][0])) == 0  # the guitar sentence is closest to the instrument one


def test_openai_client_embeddings(server, st_model, base_path):
    openai = pytest.importorskip("openai")
    from transformers import AutoTokenizer

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    answer = client.embeddings.create(model="embeddings", input=SENTENCES[:3])  # the client asks for base64
    assert answer.object == "list" and answer.model == "embeddings" and [d.index for d in answer.data] == [0, 1, 2]
    served = np.array([d.embedding for d in answer.data], dtype=np.float32)
    assert cosines(served, st_model.encode(SENTENCES[:3], convert_to_numpy=True)).min() >= 0.99999
    tokens = sum(len(ids) for ids in AutoTokenizer.from_pretrained(str(base_path))(SENTENCES[:3])["input_ids"])
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens
    as_floats = client.embeddings.create(model="embeddings", input=SENTENCES[0], encoding_format="float")
    np.testing.assert_allclose(as_floats.data[0].embedding, served[0], atol=1e-6)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="x")


@pytest.fixture(scope="module")
def fill_mask_pipeline(checkpoints):
    from transformers import pipeline

    return pipeline("fill-mask", model=str(checkpoints["masker"]), device="cpu")


@pytest.mark.parametrize("text", ["Paris is the [MASK] of France.", "The [MASK] sat on the [MASK].",
                                  "I want to [MASK] a new car tomorrow, because mine broke."])
def test_fill_mask_equals_the_transformers_pipeline(client, fill_mask_pipeline, text):
    served = post(client, "/v1/fill-mask", {"inputs": [text], "top_k": 5})["results"][0]
    expected = fill_mask_pipeline(text, top_k=5)
    groups = [served, expected] if text.count("[MASK]") > 1 else [[served], [expected]]
    for got_row, want_row in zip(*groups):
        assert [c["token"] for c in got_row] == [c["token"] for c in want_row]
        assert [c["token_str"] for c in got_row] == [c["token_str"] for c in want_row]
        assert [c["sequence"] for c in got_row] == [c["sequence"] for c in want_row]
        np.testing.assert_allclose([c["score"] for c in got_row], [c["score"] for c in want_row], rtol=1e-4,
                                   atol=1e-7)


def test_choice_equals_transformers_multiple_choice(client, checkpoints):
    from transformers import AutoTokenizer, BertForMultipleChoice

    context = "She opened her umbrella because"
    choices = ["it started to rain.", "the soup was cold.", "the train had left the station.", "of the rain."]
    body = post(client, "/v1/choice", {"inputs": {"context": context, "choices": choices}})
    ranked = body["results"][0]
    folder = str(checkpoints["chooser"])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer([context] * len(choices), choices, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = BertForMultipleChoice.from_pretrained(folder)(**{k: v[None] for k, v in encoded.items()}).logits[0]
    probs = torch.softmax(logits, -1).numpy()
    assert [r["index"] for r in ranked] == list(np.argsort(-probs, kind="stable"))
    assert [r["choice"] for r in ranked] == [choices[r["index"]] for r in ranked]
    np.testing.assert_allclose([r["score"] for r in ranked], probs[[r["index"] for r in ranked]], atol=1e-5)
    assert abs(sum(r["score"] for r in ranked) - 1.0) < 1e-5


@pytest.mark.slow
def test_stsb_dev_spearman_through_embed_matches_sentence_transformers(client, st_model, shared_data):
    from scipy.stats import spearmanr

    from tasks import readers

    pairs = readers.read_glue(shared_data / "stsb" / "dev.tsv", "stsb")
    first, second = [p.text for p in pairs], [p.text_pair for p in pairs]
    gold = [float(p.label) for p in pairs]

    def served(texts: list[str]) -> np.ndarray:
        vectors = []
        for start in range(0, len(texts), 64):
            vectors += [r["embedding"]
                        for r in post(client, "/v1/embed", {"inputs": texts[start : start + 64]})["results"]]
        return np.array(vectors)

    ours = spearmanr(cosines(served(first), served(second)), gold).statistic * 100
    reference = spearmanr(cosines(st_model.encode(first), st_model.encode(second)), gold).statistic * 100
    print(f"STS-B dev Spearman x100 over {len(pairs)} pairs: /v1/embed {ours:.2f}, "
          f"sentence-transformers {reference:.2f}")
    assert abs(ours - reference) <= 0.5
