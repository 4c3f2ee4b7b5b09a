"""/v1/ner on a real server: entity spans never take in an emoji the tokenizer made [UNK] or a hyphen at
their edges, and a hyphenated name the model tags piece by piece comes back whole.

The test `entities` model knows one type, LOC (city names in a few templates): it tags cities reliably, and
an [UNK] standing where a city or a name would be ("🚀Acme", "🚀Paris") too, so the emoji cases are checked
against gold spans with cities. It knows no people or companies: the name cases are checked by the property
that holds whatever the model predicts.
"""

from __future__ import annotations

import httpx
import pytest

from tasks.ner import HYPHENS
from tasks.runtime.graphemes import extend_end
from tasks.runtime.tokenizer import UNK, load_tokenizer

GROUPED = ("simple", "first", "average", "max")
ANY_MODEL = [
    "🚀Acme Corp said it would open an office.",
    "I love 😀Google",
    "Jean-Pierre Müller-Lüdenscheidt spoke.",
    "Zoë Ruiz-Peña spoke.",
    "Zoe\u0308 Ruiz-Pen\u0303a met Rene\u0301-Pierre in Zu\u0308rich-Oerlikon.",
    "She drank Coca-Cola in Paris-Berlin trains.",
    "The museum in Saint-Malo was closed.",
    "We flew to 👩\u200d💻Paris last week.",
    "We flew to Paris👩\u200d💻 last week.",
    "The train from Berlin🇩🇪 was late again.",
    "We flew to 🚀 Paris - Berlin 🚀 last week.",
    "They opened an office in Aix-en-Provence.",
]


def ner(client: httpx.Client, texts: list[str], aggregation: str) -> list[list[dict]]:
    response = client.post("/v1/ner", json={"model": "entities", "inputs": texts, "aggregation": aggregation})
    assert response.status_code == 200, response.text
    return response.json()["results"]


@pytest.fixture(scope="module")
def entities_tokenizer(bundle_repository):
    return load_tokenizer(bundle_repository / "entities" / "tokenizer.json")


@pytest.mark.parametrize("aggregation", GROUPED)
def test_no_entity_edge_is_an_unk_symbol_or_a_hyphen(client, entities_tokenizer, aggregation):
    unk_id = entities_tokenizer.token_to_id(UNK)
    touching_unk = 0
    for text, entities in zip(ANY_MODEL, ner(client, ANY_MODEL, aggregation)):
        encoding = entities_tokenizer.encode(text, add_special_tokens=False)
        in_unk = [False] * len(text)
        for token_id, (start, end) in zip(encoding.ids, encoding.offsets):
            if token_id == unk_id:
                in_unk[start:end] = [True] * (end - start)
        for e in entities:
            start, end = e["start"], e["end"]
            assert 0 <= start < end <= len(text) and e["text"] == text[start:end], (text, e)
            for edge in (start, end - 1):
                ch = text[edge]
                assert ch not in HYPHENS and not ch.isspace(), (text, e)
                assert not (in_unk[edge] and not ch.isalnum()), (text, e)
            assert extend_end(text, end) == end, (text, e)  # never inside a grapheme cluster
            touching_unk += any(in_unk[start:end])
    assert touching_unk >= 3, "the model tagged no [UNK]: the edge rule went unchecked"


@pytest.mark.parametrize("aggregation", GROUPED)
def test_an_emoji_glued_to_a_city_stays_out(client, aggregation):
    gold = {
        "We flew to 🚀Paris last week.": [("LOC", "Paris", 12, 17)],
        "We flew to Paris🚀 last week.": [("LOC", "Paris", 11, 16)],
        "We flew to 🇫🇷Paris last week.": [("LOC", "Paris", 13, 18)],
        "We flew to 👩\u200d💻Paris last week.": [("LOC", "Paris", 14, 19)],
        "We flew to 👍🏽Tokyo last week.": [("LOC", "Tokyo", 13, 18)],
        "We flew to 🚀 Paris last week.": [("LOC", "Paris", 13, 18)],
    }
    texts = list(gold)
    for text, entities in zip(texts, ner(client, texts, aggregation)):
        assert [(e["entity"], e["text"], e["start"], e["end"]) for e in entities] == gold[text], text
    # The model tags the [UNK] "🚀Paris" as a whole: the token itself spans the emoji.
    raw = ner(client, texts[:1], "none")[0]
    assert [(e["entity"], e["text"]) for e in raw] == [("B-LOC", "🚀Paris")]


@pytest.mark.parametrize("aggregation", GROUPED)
def test_a_hyphenated_city_tagged_piece_by_piece_comes_back_whole(client, aggregation):
    texts = ["We flew to Aix-en-Provence last week.", "The train from Aix-en-Provence was late again.",
             "We flew to Zu\u0308rich last week."]
    # Each piece of the name is tagged B-LOC and the hyphens O: the pipeline's grouping gives three entities.
    raw = ner(client, texts[:1], "none")[0]
    assert [(e["entity"], e["text"]) for e in raw] == [("B-LOC", "Aix"), ("B-LOC", "en"), ("B-LOC", "Provence")]
    found = ner(client, texts, aggregation)
    assert [[(e["entity"], e["text"], e["start"], e["end"]) for e in entities] for entities in found] == [
        [("LOC", "Aix-en-Provence", 11, 26)], [("LOC", "Aix-en-Provence", 15, 30)],
        [("LOC", "Zu\u0308rich", 11, 18)]]
