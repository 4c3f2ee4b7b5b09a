"""conlleval metrics and IOB helpers against hand-computed cases and the real CoNLL-2003 files."""

from __future__ import annotations

import random

import pytest

from tasks.ner_metrics import conlleval, iob1_to_iob2, iob_chunks, split_tag, starts_chunk_with_inside


def test_split_tag_at_first_hyphen():
    assert split_tag("B-PER") == ("B", "PER")
    assert split_tag("I-creative-work") == ("I", "creative-work")
    assert split_tag("O") == ("O", "")


@pytest.mark.parametrize(
    ("tags", "chunks"),
    [
        (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 2), ("LOC", 3, 4)]),
        (["I-PER", "I-PER", "O"], [("PER", 0, 2)]),  # IOB1: an entity starts with I-
        (["O", "I-LOC"], [("LOC", 1, 2)]),
        (["B-PER", "B-PER"], [("PER", 0, 1), ("PER", 1, 2)]),  # adjacent same type, IOB2
        (["I-PER", "B-PER"], [("PER", 0, 1), ("PER", 1, 2)]),  # adjacent same type, IOB1
        (["B-PER", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 2)]),  # I- of another type starts a chunk
        (["I-ORG", "I-ORG", "I-LOC", "I-LOC"], [("ORG", 0, 2), ("LOC", 2, 4)]),
        (["B-creative-work", "I-creative-work"], [("creative-work", 0, 2)]),
        (["O", "O"], []),
        ([], []),
    ],
)
def test_iob_chunks(tags, chunks):
    assert iob_chunks(tags) == chunks


def test_iob1_to_iob2():
    iob1 = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG", "I-ORG", "O", "B-MISC"]
    assert iob1_to_iob2(iob1) == ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG", "I-ORG", "O", "B-MISC"]
    assert starts_chunk_with_inside(iob1) == [0, 4, 5]
    iob2 = ["B-PER", "I-PER", "B-PER", "O", "B-LOC"]
    assert iob1_to_iob2(iob2) == iob2  # the identity on valid IOB2


def test_conlleval_hand_computed_micro_and_per_type():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "B-MISC", "I-MISC"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O", "B-MISC", "O"]]
    # gold chunks: PER, LOC, ORG, MISC (4); predicted: PER, ORG, ORG, MISC (4); correct: PER, ORG (2)
    r = conlleval(gold, pred)
    assert (r["n_gold"], r["n_predicted"], r["n_correct"]) == (4, 4, 2)
    assert r["precision"] == pytest.approx(0.5)
    assert r["recall"] == pytest.approx(0.5)
    assert r["f1"] == pytest.approx(0.5)
    assert r["accuracy"] == pytest.approx(6 / 8)
    assert list(r["per_type"]) == ["LOC", "MISC", "ORG", "PER"]
    assert r["per_type"]["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0,
                                    "n_gold": 1, "n_predicted": 1, "n_correct": 1}
    assert r["per_type"]["ORG"]["precision"] == pytest.approx(0.5)
    assert r["per_type"]["ORG"]["recall"] == pytest.approx(1.0)
    assert r["per_type"]["ORG"]["f1"] == pytest.approx(2 / 3)
    assert r["per_type"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0,
                                    "n_gold": 1, "n_predicted": 0, "n_correct": 0}
    assert r["per_type"]["MISC"]["n_correct"] == 0  # a truncated span is wrong


def test_conlleval_entity_starting_with_inside_matches_its_iob2_form():
    r = conlleval([["I-PER", "I-PER", "O", "I-LOC"]], [["B-PER", "I-PER", "O", "B-LOC"]])
    assert (r["n_gold"], r["n_predicted"], r["n_correct"]) == (2, 2, 2)
    assert r["f1"] == 1.0
    assert r["accuracy"] == pytest.approx(2 / 4)  # the tags differ, the chunks do not


def test_conlleval_adjacent_same_type_entities():
    gold = [["B-PER", "B-PER", "O"]]  # two one-word people
    merged = [["B-PER", "I-PER", "O"]]  # one two-word person
    r = conlleval(gold, merged)
    assert (r["n_gold"], r["n_predicted"], r["n_correct"]) == (2, 1, 0)
    assert r["f1"] == 0.0
    r = conlleval(gold, [["B-PER", "B-PER", "O"]])
    assert r["n_correct"] == 2


def test_conlleval_inside_of_other_type_and_sentence_boundaries():
    # I-LOC after B-PER starts a LOC chunk; an entity never continues into the next sentence.
    gold = [["B-PER", "I-LOC"], ["I-LOC", "O"]]
    pred = [["B-PER", "B-LOC"], ["B-LOC", "O"]]
    r = conlleval(gold, pred)
    assert (r["n_gold"], r["n_predicted"], r["n_correct"]) == (3, 3, 3)


def test_conlleval_no_predictions_and_mismatched_lengths():
    r = conlleval([["B-PER", "O"]], [["O", "O"]])
    assert (r["precision"], r["recall"], r["f1"]) == (0.0, 0.0, 0.0)
    assert r["per_type"]["PER"]["n_predicted"] == 0
    with pytest.raises(ValueError, match="sentence 0"):
        conlleval([["O"]], [["O", "O"]])
    with pytest.raises(ValueError):
        conlleval([["O"]], [])


def test_conlleval_equals_exact_span_matching_for_bio_tags():
    """For B/I/O tags conlleval's state machine is exact (type, start, end) matching of chunks."""
    rng = random.Random(0)
    tags = ["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    for _ in range(200):
        gold = [[rng.choice(tags) for _ in range(rng.randint(0, 10))] for _ in range(3)]
        pred = [[rng.choice(tags) for _ in s] for s in gold]
        r = conlleval(gold, pred)
        gold_chunks = {(i, *c) for i, s in enumerate(gold) for c in iob_chunks(s)}
        pred_chunks = {(i, *c) for i, s in enumerate(pred) for c in iob_chunks(s)}
        assert r["n_gold"] == len(gold_chunks)
        assert r["n_predicted"] == len(pred_chunks)
        assert r["n_correct"] == len(gold_chunks & pred_chunks)


def test_conlleval_on_real_conll2003_dev(shared_data):
    from tasks.readers import read_conll

    gold = [e.tags for e in read_conll(shared_data / "conll2003" / "iob2" / "valid.txt")]
    r = conlleval(gold, gold)
    assert r["f1"] == 1.0 and r["accuracy"] == 1.0
    # Published CoNLL-2003 dev entity counts: 1837 LOC, 922 MISC, 1341 ORG, 1842 PER.
    assert {t: v["n_gold"] for t, v in r["per_type"].items()} == {"LOC": 1837, "MISC": 922, "ORG": 1341, "PER": 1842}
    # Dropping every MISC prediction: MISC recall 0, the others perfect.
    no_misc = [[t if not t.endswith("MISC") else "O" for t in s] for s in gold]
    r = conlleval(gold, no_misc)
    assert r["precision"] == 1.0
    assert r["recall"] == pytest.approx((5942 - 922) / 5942)
    assert r["per_type"]["MISC"]["recall"] == 0.0
