"""The rule-made contrast pairs of the similarity sample: each rule changes the one thing it names."""

import json
import random

import pytest

from scripts.contrast_pairs import SCORES, antonym, changed_number, contrast_pairs, negation, swapped_roles
from tasks.shipped_samples import SAMPLES


@pytest.mark.parametrize(("sentence", "expected"), [
    ("A man is riding a horse.", "A man is not riding a horse."),
    ("Two boys are jumping into a pool.", "Two boys are not jumping into a pool."),
    ("The bridge was built in 1890.", "The bridge was not built in 1890."),
    ("The dog has a stick.", None),  # no auxiliary verb: not negated by rule
])
def test_negation_puts_not_after_the_first_auxiliary(sentence, expected):
    assert negation(sentence, random.Random(0)) == expected


@pytest.mark.parametrize(("sentence", "expected"), [
    ("A small dog runs.", "A large dog runs."),
    ("White cat on a sofa.", "Black cat on a sofa."),
    ("Prices increased sharply.", "Prices decreased sharply."),
    ("A dog runs.", None),
])
def test_antonym_swaps_one_word_for_its_opposite_keeping_its_capital(sentence, expected):
    assert antonym(sentence, random.Random(0)) == expected


@pytest.mark.parametrize(("sentence", "expected"), [
    ("A dog is chasing a cat.", "A cat is chasing a dog."),
    ("The boy pushes a wagon with two pumpkins.", "A wagon pushes the boy with two pumpkins."),
    ("Horvitz replaced Gregg Gelfand as a director of the show.",
     "Gregg Gelfand replaced Horvitz as a director of the show."),
    ("A man carries a sign while standing in the rain.", "A sign carries a man while standing in the rain."),
    ("A dog is running on the grass.", None),  # no role verb
])
def test_swapped_roles_trades_subject_and_object(sentence, expected):
    assert swapped_roles(sentence, random.Random(0)) == expected


def test_changed_number_changes_one_number_and_nothing_else():
    rng = random.Random(0)
    for sentence in ("Two dogs play in the snow.", "The school opened in 1866.", "About 30 people came."):
        changed = changed_number(sentence, rng)
        before, after = sentence.split(), changed.split()
        assert len(before) == len(after)
        assert sum(a != b for a, b in zip(before, after)) == 1, changed
    assert changed_number("On April 26 the bridge opened.", rng) is None  # a day of the month is not a count


def test_pairs_carry_the_rule_score_and_differ_from_their_source():
    sentences = ["A man is riding a horse.", "Two dogs chase a ball.", "A dog is chasing a cat."]
    rows = contrast_pairs(sentences, {"negation": 5, "swapped roles": 5, "changed number": 5}, random.Random(1))
    assert rows and all(row["text"] != row["text_pair"] for row in rows)
    assert {row["label"] for row in rows} <= {SCORES["negation"], SCORES["changed number"]}
    assert sum(row["label"] == SCORES["changed number"] for row in rows) == 1  # only one sentence has a number


def test_a_rule_not_asked_for_makes_no_pairs():
    sentences = ["A small dog is chasing a cat.", "A large dog is not running."]
    assert contrast_pairs(sentences, {}, random.Random(0)) == []
    rows = contrast_pairs(sentences, {"swapped roles": 5}, random.Random(0))
    assert [row["label"] for row in rows] == [SCORES["swapped roles"]]  # no antonym or negation pairs


def test_the_shipped_similarity_sample_holds_rule_pairs_and_a_dev_set_without_them():
    def rows(split):
        return [json.loads(line) for line in (SAMPLES / "stsb" / f"{split}.jsonl").read_text().splitlines()]

    train, dev = rows("train"), rows("dev")
    negated = [r for r in train if negation(r["text"], random.Random(0)) == r["text_pair"]
               or negation(r["text_pair"], random.Random(0)) == r["text"]]
    assert len(negated) >= 100 and {r["label"] for r in negated} == {SCORES["negation"]}
    dev_texts = {r[k] for r in dev for k in ("text", "text_pair")}
    assert not dev_texts & {r[k] for r in negated for k in ("text", "text_pair")}


def test_the_probe_contrasts_only_paraphrase_pairs_of_the_dev_set():
    from scripts.contrast_probe import probe_items

    rows = [{"text": "A man is riding a horse.", "text_pair": "A person rides a horse.", "label": 4.2},
            {"text": "A woman is cooking.", "text_pair": "A dog runs.", "label": 0.4}]
    items = probe_items(rows)
    assert items and {i["text"] for i in items} == {"A man is riding a horse."}
    assert {"rule": "negation", "text": "A man is riding a horse.", "paraphrase": "A person rides a horse.",
            "contrast": "A man is not riding a horse."} in items
