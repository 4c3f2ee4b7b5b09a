"""Readers on the real data sets (counts from SOURCES.md) and on malformed files."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tasks.ner_metrics import iob_chunks
from tasks.readers import (
    NERExample,
    TextExample,
    read_conll,
    read_glue,
    read_mrpc,
    read_sst2,
    read_table,
    read_wnut17,
)

# -- real files ------------------------------------------------------------------------------------


def test_sst2_dev(shared_data):
    examples = read_sst2(shared_data / "sst2" / "dev.tsv")
    assert len(examples) == 872
    assert Counter(e.label for e in examples) == {"1": 444, "0": 428}
    assert examples[0] == TextExample("it 's a charming and often affecting journey . ", None, "1")


def test_mrpc_dev_and_train(shared_data):
    dev = read_mrpc(shared_data / "mrpc" / "dev.tsv")  # starts with a byte-order mark
    assert len(dev) == 408
    assert dev[0].label == "1"
    assert dev[0].text.startswith("He said the foodservice pie business")
    assert dev[0].text_pair == '" The foodservice pie business does not fit our long-term growth strategy .'
    assert len(read_mrpc(shared_data / "mrpc" / "train.tsv")) == 3668


def test_rte_and_stsb_dev(shared_data):
    rte = read_glue(shared_data / "rte" / "dev.tsv", "rte")
    assert len(rte) == 277
    assert {e.label for e in rte} == {"entailment", "not_entailment"}
    stsb = read_glue(shared_data / "stsb" / "dev.tsv", "stsb")
    assert len(stsb) == 1500
    assert stsb[0] == TextExample("A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0)
    assert all(isinstance(e.label, float) and 0.0 <= e.label <= 5.0 for e in stsb)


def test_conll2003_iob1_file_converts_to_the_iob2_release(shared_data):
    iob1 = read_conll(shared_data / "conll2003" / "original_iob1" / "eng.testa")  # auto-detected
    iob2 = read_conll(shared_data / "conll2003" / "iob2" / "valid.txt", iob1=False)
    assert len(iob1) == len(iob2) == 3250
    assert sum(len(e.tokens) for e in iob1) == 51362
    assert iob1 == iob2
    assert iob1[0] == NERExample(
        ["CRICKET", "-", "LEICESTERSHIRE", "TAKE", "OVER", "AT", "TOP", "AFTER", "INNINGS", "VICTORY", "."],
        ["O", "O", "B-ORG", "O", "O", "O", "O", "O", "O", "O", "O"],
    )
    assert iob1[0].line == 3
    assert all("-DOCSTART-" not in e.tokens for e in iob1)


def test_conll2003_train_counts(shared_data):
    train = read_conll(shared_data / "conll2003" / "iob2" / "train.txt")
    assert len(train) == 14041
    assert sum(len(e.tokens) for e in train) == 203621
    entities = Counter(t for e in train for t, _, _ in iob_chunks(e.tags))
    assert entities == {"PER": 6600, "LOC": 7140, "ORG": 6321, "MISC": 3438}


def test_wnut17(shared_data):
    # The train file separates sentences with lines holding a lone tab.
    for name, sentences, tokens in (("wnut17train.conll", 3394, 62730), ("emerging.dev.conll", 1009, 15733)):
        examples = read_wnut17(shared_data / "wnut17" / name)
        assert len(examples) == sentences
        assert sum(len(e.tokens) for e in examples) == tokens
    types = {t for e in examples for t, _, _ in iob_chunks(e.tags)}
    assert types == {"corporation", "creative-work", "group", "location", "person", "product"}


def test_shipped_jsonl_samples():
    from pathlib import Path

    samples = Path(__file__).resolve().parents[2] / "data" / "samples"
    if not samples.is_dir():
        pytest.skip(f"no shipped samples at {samples}")
    stsb = read_table(samples / "stsb" / "dev.jsonl", regression=True)
    assert len(stsb) == 125 and all(isinstance(e.label, float) and e.text_pair for e in stsb)
    topics = read_table(samples / "topics" / "dev.jsonl")
    assert len(topics) == 750 and all(e.text_pair is None for e in topics)
    assert {e.label for e in topics} == {"people", "places", "science_tech", "arts_media", "society"}


# -- the general reader on temp files ----------------------------------------------------------------


def test_csv_with_quotes_and_custom_columns(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('sentence,other,y\n"Hello, ""world""",b,pos\nplain,,neg\nunlabelled,x,\n', encoding="utf-8")
    examples = read_table(path, text_column="sentence", text_pair_column="other", label_column="y")
    assert examples == [
        TextExample('Hello, "world"', "b", "pos"),
        TextExample("plain", "", "neg"),
        TextExample("unlabelled", "x", None),
    ]


def test_tsv_keeps_quotes_and_missing_columns_give_none(tmp_path):
    path = tmp_path / "data.tsv"
    path.write_text('text\tlabel\n" quoted\t1\n', encoding="utf-8")
    assert read_table(path) == [TextExample('" quoted', None, "1")]
    assert read_table(path, label_column=None) == [TextExample('" quoted', None, None)]


def test_jsonl_labels(tmp_path):
    path = tmp_path / "data.jsonl"
    rows = [{"text": "a", "text_pair": "b", "label": 1}, {"text": "c", "label": 2.5}, {"text": "d"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    assert [e.label for e in read_table(path)] == ["1", "2.5", None]
    assert [e.label for e in read_table(path, regression=True)] == [1.0, 2.5, None]
    assert read_table(path)[0].text_pair == "b"


@pytest.mark.parametrize(
    ("name", "content", "kwargs", "line", "message"),
    [
        ("bad.jsonl", '{"text": "a"}\n{"text": \n', {}, 2, "invalid JSON"),
        ("bad.jsonl", '{"text": "a"}\n["a"]\n', {}, 2, "JSON object"),
        ("bad.jsonl", '{"text": "a"}\n{"label": "x"}\n', {}, 2, "no 'text'"),
        ("bad.jsonl", '{"text": 3}\n', {}, 1, "not text"),
        ("bad.jsonl", '{"text": "a", "label": "high"}\n', {"regression": True}, 1, "not a number"),
        ("bad.tsv", "text\tlabel\na\t1\nb\t1\textra\n", {}, 3, "3 fields"),
        ("bad.csv", "label\n1\n", {}, 1, "no 'text' column"),
        ("bad.csv", "", {}, 1, "empty file"),
    ],
)
def test_malformed_tables_name_file_and_line(tmp_path, name, content, kwargs, line, message):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message) as err:
        read_table(path, **kwargs)
    assert f"{path}:{line}:" in str(err.value)


def test_unknown_format_and_glue_task(tmp_path):
    with pytest.raises(ValueError, match="format"):
        read_table(tmp_path / "data.txt")
    with pytest.raises(ValueError, match="unknown GLUE task"):
        read_glue(tmp_path / "x.tsv", "squad")


# -- CoNLL on temp files ------------------------------------------------------------------------------


def test_conll_docstart_ends_a_sentence_and_iob1_is_converted(tmp_path):
    path = tmp_path / "x.conll"
    path.write_text(
        "-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nrejects VBZ I-VP O\n-DOCSTART- -X- O O\n"
        "Peter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\nJohn NNP I-NP B-PER\n\n\n",
        encoding="utf-8",
    )
    examples = read_conll(path)
    assert [e.tokens for e in examples] == [["EU", "rejects"], ["Peter", "Blackburn", "John"]]
    assert [e.tags for e in examples] == [["B-ORG", "O"], ["B-PER", "I-PER", "B-PER"]]
    assert [e.line for e in examples] == [3, 6]
    assert read_conll(path, iob1=True) == examples


@pytest.mark.parametrize(
    ("content", "kwargs", "line", "message"),
    [
        ("EU B-ORG\nrejects\n", {}, 2, "1 columns, expected 2"),
        ("EU\n", {}, 1, "a token and a tag"),
        ("EU NNP B-ORG\nrejects VBZ X-MISC\n", {}, 2, "'X-MISC' is not O"),
        ("EU NNP B-\n", {}, 1, "'B-' is not O"),
        ("a O\n\nEU I-ORG\n", {"iob1": False}, 3, "not IOB2"),
        ("\n\n", {}, None, "no sentences"),
    ],
)
def test_malformed_conll_names_file_and_line(tmp_path, content, kwargs, line, message):
    path = tmp_path / "bad.conll"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message) as err:
        read_conll(path, **kwargs)
    assert str(path) in str(err.value)
    if line is not None:
        assert f"{path}:{line}:" in str(err.value)


def test_conll_tab_separated_tokens_may_hold_spaces(tmp_path):
    path = tmp_path / "x.conll"
    path.write_text("New York\tB-location\nrocks\tO\n\t\nok\tO\n", encoding="utf-8")
    assert read_conll(path) == [NERExample(["New York", "rocks"], ["B-location", "O"]), NERExample(["ok"], ["O"])]
