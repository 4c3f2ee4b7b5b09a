"""A request list is tokenized at once (one `encode_batch`): its answers and refusals are those of its inputs
sent one by one, and a refused input is still named by its index. Token counts come from `tokenizers`."""

from __future__ import annotations

import pytest

from tasks.runtime.tokenizer import plain_tokenizer

LONG = "an astonishingly long-winded review that rambles about the plot , the actors and the music " * 20
MIXED = ["a charming film .", LONG, "Café crème, naïve façade — déjà vu! 東京タワー", "Emoji 👩‍👩‍👧 e\u0301 Straße",
         "dull", LONG + " and more"]


def tokens_alone(tokenizer, text: str, pair: str | None = None) -> int:
    return len(plain_tokenizer(tokenizer).encode(text, pair).ids)


def test_a_list_answers_as_its_inputs_sent_alone(client):
    listed = client.post("/v1/classify", json={"inputs": MIXED, "top_k": 2})
    assert listed.status_code == 200, listed.text
    alone = [client.post("/v1/classify", json={"inputs": text, "top_k": 2}).json()["results"][0] for text in MIXED]
    for got, want in zip(listed.json()["results"], alone):
        assert [(e["label"], e["truncated"]) for e in got] == [(e["label"], e["truncated"]) for e in want]
        assert [e["score"] for e in got] == pytest.approx([e["score"] for e in want], abs=1e-5)
    assert [r[0]["truncated"] for r in listed.json()["results"]] == [False, True, False, False, False, True]


@pytest.mark.parametrize("route, inputs, where, texts", [
    ("/v1/classify", ["fine", "also fine", LONG, "fine again", LONG], "inputs[2]", (LONG, None)),
    ("/v1/embed", ["fine", "also fine", LONG, LONG], "inputs[2]", (LONG, None)),
    ("/v1/pair", [{"text": "a", "text_pair": "b"}, {"text": "short", "text_pair": LONG}], "inputs[1]",
     ("short", LONG)),
    ("/v1/choice", [{"context": "c", "choices": ["a", "b"]}, {"context": "c", "choices": ["a", LONG]},
                    {"context": LONG, "choices": ["x", "y"]}], "inputs[1]", ("c", LONG)),
    ("/v1/similarity", [{"source": "a", "targets": ["b"]}, {"source": "a", "targets": ["b", LONG]}],
     "inputs[1].targets[1]", (LONG, None)),
])
def test_an_over_long_input_in_a_list_is_named_by_its_index(client, tokenizer, route, inputs, where, texts):
    response = client.post(route, json={"inputs": inputs, "truncate": False})
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error.startswith(f"{where}: input is {tokens_alone(tokenizer, *texts)} tokens long"), error
    assert "truncate" in error


def test_the_first_refused_input_wins_whatever_refuses_it(client, tokenizer):
    too_long_first = [{"context": LONG, "choices": ["a", "b"]}, {"context": "c", "choices": ["only one"]}]
    response = client.post("/v1/choice", json={"inputs": too_long_first, "truncate": False})
    assert response.status_code == 413 and response.json()["error"].startswith("inputs[0]: input is")
    response = client.post("/v1/choice", json={"inputs": too_long_first[::-1], "truncate": False})
    assert response.status_code == 422 and response.json()["error"].startswith("inputs[0].choices: 1 given")
    masked = ["Paris is the [MASK] of France.", LONG + " [MASK]", "no mask"]
    response = client.post("/v1/fill-mask", json={"inputs": masked})
    assert response.status_code == 413, response.text
    assert response.json()["error"].startswith(f"inputs[1]: input is {tokens_alone(tokenizer, masked[1])} tokens")
    response = client.post("/v1/fill-mask", json={"inputs": [masked[0], masked[2], masked[1]]})
    assert response.status_code == 422 and response.json()["error"].startswith("inputs[1]: no [MASK]")
