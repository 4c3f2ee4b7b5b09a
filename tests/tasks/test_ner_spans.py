"""Entity spans follow words: [UNK] characters and hyphens at entity edges, hyphenated and accented names.

The real tokenizer of the default model, logits written by hand to put a label on each token, and gold
spans written here. Each case lists the tokens the tokenizer makes (asserted) with the tag put on each.
"""

from __future__ import annotations

import numpy as np
import pytest

from tasks.ner import NEROptions, NERTask, decode_entities, ner_windows
from tasks.runtime.graphemes import extend_end
from tasks.runtime.spec import TaskSpec

LABELS = ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
GROUPED = ("simple", "first", "average", "max")


def token_logits(tags: list[tuple[str, float]]) -> np.ndarray:
    """[CLS] + one row per token + [SEP]: softmax puts probability p on the tag and the rest evenly."""
    probs = np.full((len(tags) + 2, len(LABELS)), 1.0 / len(LABELS))
    for row, (tag, p) in enumerate(tags, start=1):
        probs[row] = (1 - p) / (len(LABELS) - 1)
        probs[row, LABELS.index(tag)] = p
    return np.log(probs).astype(np.float32)


def decode(tokenizer, text: str, tagged: list[tuple], aggregation: str = "simple") -> list[tuple]:
    """`tagged`: (token, tag) or (token, tag, p) for every token of `text`, p = 0.9 when not given.
    Returns (type, text, start, end, score) per entity, after checking that text[start:end] is its text."""
    windows = ner_windows(tokenizer, text)
    assert len(windows) == 1
    tokens = tokenizer.encode(text, add_special_tokens=False).tokens
    assert tokens == [t[0] for t in tagged]
    logits = token_logits([(t[1], t[2] if len(t) > 2 else 0.9) for t in tagged])
    entities = decode_entities(text, windows, [logits], LABELS, aggregation=aggregation)
    for e in entities:
        assert e["text"] == text[e["start"]:e["end"]]
        assert extend_end(text, e["end"]) == e["end"]  # no grapheme cluster split
    return [(e["entity"], e["text"], e["start"], e["end"], round(e["score"], 6)) for e in entities]


def spans(found: list[tuple]) -> list[tuple]:
    return [f[:4] for f in found]


# -- [UNK]: characters the tokenizer did not understand ------------------------------------------------------------


@pytest.mark.parametrize("aggregation", GROUPED)
def test_an_emoji_glued_before_a_name_stays_out_of_it(tokenizer, aggregation):
    text = "🚀Acme Corp said it would buy them."
    rest = [("said", "O"), ("it", "O"), ("would", "O"), ("buy", "O"), ("them", "O"), (".", "O")]
    # "🚀Acme" is one [UNK]; the model put the name's tag on it: the emoji is no part of the name.
    found = decode(tokenizer, text, [("[UNK]", "B-ORG"), ("corp", "I-ORG"), *rest], aggregation)
    assert found == [("ORG", "Acme Corp", 1, 10, 0.9)]
    # The model left the [UNK] out: so do we.
    found = decode(tokenizer, text, [("[UNK]", "O"), ("corp", "B-ORG"), *rest], aggregation)
    assert spans(found) == [("ORG", "Corp", 6, 10)]

    found = decode(tokenizer, "I love 😀Google", [("i", "O"), ("love", "O"), ("[UNK]", "B-ORG")], aggregation)
    assert spans(found) == [("ORG", "Google", 8, 14)]
    found = decode(tokenizer, "Acme🚀 rose", [("[UNK]", "B-ORG"), ("rose", "O")], aggregation)
    assert spans(found) == [("ORG", "Acme", 0, 4)]


@pytest.mark.parametrize("aggregation", GROUPED)
def test_an_emoji_token_at_an_entity_edge_is_dropped_with_its_score(tokenizer, aggregation):
    tagged = [("[UNK]", "B-ORG", 0.5), ("ac", "I-ORG"), ("##me", "I-ORG"), ("corp", "I-ORG")]
    assert decode(tokenizer, "🚀 Acme Corp", tagged, aggregation) == [("ORG", "Acme Corp", 2, 11, 0.9)]
    # An entity of nothing but the emoji is no entity.
    assert decode(tokenizer, "See 🚀 soon", [("see", "O"), ("[UNK]", "B-ORG"), ("soon", "O")], aggregation) == []


def test_aggregation_none_still_returns_each_token_as_it_is(tokenizer):
    found = decode(tokenizer, "🚀Acme Corp", [("[UNK]", "B-ORG"), ("corp", "I-ORG")], "none")
    assert spans(found) == [("B-ORG", "🚀Acme", 0, 5), ("I-ORG", "Corp", 6, 10)]


@pytest.mark.parametrize("aggregation", GROUPED)
def test_an_unk_the_model_tagged_inside_a_name_stays(tokenizer, aggregation):
    tagged = [("ac", "B-ORG"), ("##me", "I-ORG"), ("[UNK]", "I-ORG"), ("corp", "I-ORG"), ("rose", "O")]
    assert spans(decode(tokenizer, "Acme 🚀 Corp rose", tagged, aggregation)) == [("ORG", "Acme 🚀 Corp", 0, 11)]
    # Tagged O, it splits the name as any O does (transformers' grouping: an I- after O begins an entity).
    tagged[2] = ("[UNK]", "O")
    assert spans(decode(tokenizer, "Acme 🚀 Corp rose", tagged, aggregation)) == [
        ("ORG", "Acme", 0, 4), ("ORG", "Corp", 7, 11)]
    # An emoji between letters of one [UNK] word is inside the name: only the edges are trimmed.
    tagged = [("[UNK]", "B-ORG"), ("'", "O"), ("s", "O"), ("opened", "O")]
    assert spans(decode(tokenizer, "Mc😀Donald's opened", tagged, aggregation)) == [("ORG", "Mc😀Donald", 0, 9)]


@pytest.mark.parametrize("aggregation", GROUPED)
def test_emoji_sequences_are_trimmed_whole(tokenizer, aggregation):
    # zero-width-joiner sequence (3 code points), before and after the name
    tagged = [("[UNK]", "B-ORG"), ("corp", "I-ORG"), ("hired", "O")]
    assert spans(decode(tokenizer, "👩\u200d💻Acme Corp hired", tagged, aggregation)) == [("ORG", "Acme Corp", 3, 12)]
    tagged = [("ac", "B-ORG"), ("##me", "I-ORG"), ("[UNK]", "I-ORG"), ("hired", "O")]
    assert spans(decode(tokenizer, "Acme Corp👩\u200d💻 hired", tagged, aggregation)) == [("ORG", "Acme Corp", 0, 9)]
    # a flag (two regional indicators), a skin tone, a variation selector
    assert spans(decode(tokenizer, "🇫🇷Paris hosted", [("[UNK]", "B-LOC"), ("hosted", "O")], aggregation)) == [
        ("LOC", "Paris", 2, 7)]
    assert spans(decode(tokenizer, "👍🏽Tokyo won", [("[UNK]", "B-LOC"), ("won", "O")], aggregation)) == [
        ("LOC", "Tokyo", 2, 7)]
    assert spans(decode(tokenizer, "❤\ufe0fParis", [("[UNK]", "B-LOC")], aggregation)) == [("LOC", "Paris", 2, 7)]


# -- hyphens -----------------------------------------------------------------------------------------------------------


# What a model trained with the label on each word's first token may well say of the later pieces.
JEAN_PIERRE = [("jean", "B-PER"), ("-", "O"), ("pierre", "B-PER"), ("muller", "I-PER"), ("-", "O"), ("lu", "B-PER"),
               ("##den", "I-PER"), ("##sche", "I-PER"), ("##id", "I-PER"), ("##t", "I-PER"), ("spoke", "O")]


@pytest.mark.parametrize("aggregation", GROUPED)
def test_a_hyphenated_accented_name_comes_back_whole(tokenizer, aggregation):
    text = "Jean-Pierre Müller-Lüdenscheidt spoke"
    found = decode(tokenizer, text, JEAN_PIERRE, aggregation)
    assert spans(found) == [("PER", "Jean-Pierre Müller-Lüdenscheidt", 0, 31)]
    if aggregation == "simple":  # the hyphens tagged O are not counted in the score
        assert found[0][4] == 0.9
    # at the end of a sentence, and at the very end of the text
    tagged = [("we", "O"), ("met", "O"), ("zoe", "B-PER"), ("ruiz", "I-PER"), ("-", "O"), ("pena", "I-PER"), (".", "O")]
    assert spans(decode(tokenizer, "We met Zoë Ruiz-Peña.", tagged, aggregation)) == [("PER", "Zoë Ruiz-Peña", 7, 20)]
    tagged = [("yesterday", "O"), ("i", "O"), ("met", "O"), ("jean", "B-PER"), ("-", "O"), ("pierre", "B-PER")]
    assert spans(decode(tokenizer, "Yesterday I met Jean-Pierre", tagged, aggregation)) == [
        ("PER", "Jean-Pierre", 16, 27)]
    # the non-breaking hyphen
    tagged = [("jean", "B-PER"), ("\u2011", "O"), ("pierre", "B-PER")]
    assert spans(decode(tokenizer, "Jean\u2011Pierre", tagged, aggregation)) == [("PER", "Jean\u2011Pierre", 0, 11)]


@pytest.mark.parametrize("aggregation", GROUPED)
def test_coca_cola_is_one_org(tokenizer, aggregation):
    tagged = [("she", "O"), ("drank", "O"), ("coca", "B-ORG"), ("-", "O"), ("cola", "B-ORG"), (".", "O")]
    assert decode(tokenizer, "She drank Coca-Cola.", tagged, aggregation) == [("ORG", "Coca-Cola", 10, 19, 0.9)]
    # The hyphen tagged B-ORG (transformers: "Coca" and "-Cola"): one entity, the hyphen's score counted.
    tagged[3] = ("-", "B-ORG", 0.6)
    assert decode(tokenizer, "She drank Coca-Cola.", tagged, aggregation) == [("ORG", "Coca-Cola", 10, 19, 0.8)]


@pytest.mark.parametrize("aggregation", GROUPED)
def test_a_hyphen_stays_out_unless_it_joins_two_pieces_of_one_type(tokenizer, aggregation):
    # between two different entities
    tagged = [("the", "O"), ("ac", "B-ORG"), ("##me", "I-ORG"), ("-", "O"), ("google", "B-PER"), ("deal", "O")]
    expected = [("ORG", "Acme", 4, 8), ("PER", "Google", 9, 15)]
    assert spans(decode(tokenizer, "the Acme-Google deal", tagged, aggregation)) == expected
    tagged[3] = ("-", "I-ORG")  # the model put the hyphen in the first one: not at its edge
    assert spans(decode(tokenizer, "the Acme-Google deal", tagged, aggregation)) == expected
    # between a tagged and an untagged word, either way round
    tagged = [("the", "O"), ("paris", "B-LOC"), ("-", "I-LOC"), ("based", "O"), ("firm", "O")]
    assert spans(decode(tokenizer, "the Paris-based firm", tagged, aggregation)) == [("LOC", "Paris", 4, 9)]
    tagged = [("an", "O"), ("anti", "O"), ("-", "I-ORG"), ("google", "I-ORG"), ("stance", "O")]
    assert spans(decode(tokenizer, "an anti-Google stance", tagged, aggregation)) == [("ORG", "Google", 8, 14)]
    # the second half left untagged by the model stays out
    tagged = [("muller", "B-PER"), ("-", "O"), ("lu", "O"), ("##den", "O"), ("##sche", "O"), ("##id", "O"),
              ("##t", "O")]
    assert spans(decode(tokenizer, "Müller-Lüdenscheidt", tagged, aggregation)) == [("PER", "Müller", 0, 6)]
    # nothing tagged
    tagged = [("a", "O"), ("well", "O"), ("-", "O"), ("known", "O"), ("firm", "O")]
    assert decode(tokenizer, "a well-known firm", tagged, aggregation) == []
    # spaces around the hyphen, or a dash instead: two entities
    tagged = [("ac", "B-ORG"), ("##me", "I-ORG"), ("-", "O"), ("corp", "B-ORG")]
    assert spans(decode(tokenizer, "Acme - Corp", tagged, aggregation)) == [
        ("ORG", "Acme", 0, 4), ("ORG", "Corp", 7, 11)]
    tagged = [("paris", "B-LOC"), ("\u2013", "O"), ("berlin", "B-LOC")]
    assert spans(decode(tokenizer, "Paris\u2013Berlin", tagged, aggregation)) == [
        ("LOC", "Paris", 0, 5), ("LOC", "Berlin", 6, 12)]


# -- combining accents, long texts, the served decode ------------------------------------------------------------------


@pytest.mark.parametrize("aggregation", GROUPED)
def test_decomposed_accents_stay_with_their_letters(tokenizer, aggregation):
    # NFD: the uncased normalizer strips U+0301 / U+0308, the offsets skip them; spans do not.
    text = "Rene\u0301-Pierre Zoe\u0308 arrived"
    tagged = [("rene", "B-PER"), ("-", "O"), ("pierre", "B-PER"), ("zoe", "I-PER"), ("arrived", "O")]
    assert spans(decode(tokenizer, text, tagged, aggregation)) == [("PER", "Rene\u0301-Pierre Zoe\u0308", 0, 17)]
    tagged = [("zoe", "B-PER"), ("-", "O"), ("pena", "B-PER")]
    assert spans(decode(tokenizer, "Zoe\u0308-Pen\u0303a", tagged, aggregation)) == [
        ("PER", "Zoe\u0308-Pen\u0303a", 0, 10)]
    assert spans(decode(tokenizer, "met Zoe\u0308", [("met", "O"), ("zoe", "B-PER")], aggregation)) == [
        ("PER", "Zoe\u0308", 4, 8)]


def test_the_served_decode_over_several_windows(tokenizer):
    """NERTask's prepare and decode (what /v1/ner runs), windows of 16 tokens: the name spans two windows."""
    filler = "The committee met again on Tuesday and talked for hours. " * 3
    text = filler + "🚀Acme Corp hired Jean-Pierre Müller-Lüdenscheidt."
    spec = TaskSpec(task="ner", labels=LABELS, max_seq_length=16, doc_stride=4)
    task = NERTask()
    prepared = task.prepare(tokenizer, spec, text, NEROptions())
    windows = prepared.state
    assert len(windows) > 3
    tags = ["O"] * windows.num_tokens
    n = len(tokenizer.encode(filler, add_special_tokens=False).ids)
    tags[n : n + 2] = ["B-ORG", "I-ORG"]  # [UNK] corp
    tags[n + 3 : n + 14] = [t for _, t in JEAN_PIERRE[:10]] + ["O"]  # jean ... ##t .
    per_window = []
    for item, start in zip(windows, windows.starts.tolist()):
        rows = [(tag, 0.9) for tag in tags[start : start + len(item) - 2]]
        per_window.append({"logits": token_logits(rows)})
    entities = task.decode(tokenizer, spec, [prepared], [per_window], NEROptions())[0]
    at = len(filler)
    assert [(e["entity"], e["text"], e["start"], e["end"]) for e in entities] == [
        ("ORG", "Acme Corp", at + 1, at + 10), ("PER", "Jean-Pierre Müller-Lüdenscheidt", at + 17, at + 48)]


# -- words stay whole ---------------------------------------------------------------------------------------------

WORDY_TEXTS = [
    "Tim Cook spoke in Cupertino about Apple's plans.",
    "Zoë Saldaña and Jean-Pierre Müller-Lüdenscheidt met Łukasz Żółkiewski in Łódź.",
    "Siobhán O'Neill-Kavanagh joined Nestlé S.A. near Genève, says Ångström.",
    "Dr. Krzysztof Szczęsny-Wróbel visited Reykjavík and Þórshöfn with Ólafur.",
]


def _inside_a_run_of_letters(text: str, at: int) -> bool:
    """True when a boundary at `at` cuts a run of letters or digits (checked on the text itself)."""
    return 0 < at < len(text) and text[at - 1].isalnum() and text[at].isalnum()


@pytest.mark.parametrize("aggregation", GROUPED)
def test_no_entity_begins_or_ends_inside_a_word(tokenizer, aggregation):
    """Random tags on every token (sub-tokens of one word disagreeing all the time): whatever the aggregation, an
    entity's edges fall between words, never inside a run of letters."""
    rng = np.random.default_rng(7)
    checked = 0
    for text in WORDY_TEXTS:
        windows = ner_windows(tokenizer, text)
        assert len(windows) == 1
        for _ in range(25):
            logits = rng.normal(scale=4.0, size=(len(windows[0]), len(LABELS))).astype(np.float32)
            for e in decode_entities(text, windows, [logits], LABELS, aggregation=aggregation):
                assert not _inside_a_run_of_letters(text, e["start"]), (text, e)
                assert not _inside_a_run_of_letters(text, e["end"]), (text, e)
                checked += 1
    assert checked > 100


@pytest.mark.parametrize("aggregation", GROUPED)
def test_cupertino_with_disagreeing_sub_tokens_is_one_entity(tokenizer, aggregation):
    text = "Apple is based in Cupertino"
    tokens = tokenizer.encode(text, add_special_tokens=False).tokens
    assert tokens[-3:] == ["cup", "##ert", "##ino"]  # one word, three tokens
    rest = [(t, "O") for t in tokens[:-3]]
    # The first token says ORG, the later ones LOC: the word is the first token's (what the model was trained on).
    found = decode(tokenizer, text, [*rest, ("cup", "B-ORG", 0.56), ("##ert", "B-LOC", 0.5), ("##ino", "I-LOC")],
                   aggregation)
    if aggregation in ("max", "average"):  # ##ino's I-LOC 0.9 wins the word's max and its average
        assert spans(found) == [("LOC", "Cupertino", 18, 27)]
    else:
        assert spans(found) == [("ORG", "Cupertino", 18, 27)]
