"""Bad rows in every training format are named by file and line (the line written in each test), stop the reading
by default, and under BadRows("skip") are counted and left out while the good rows are read."""

from __future__ import annotations

import json

import pytest

from tasks.qa import read_squad
from tasks.readers import BadRows, DataError, read_conll, read_table

GOOD = [{"text": f"row {i}", "label": "a" if i % 2 else "b"} for i in range(6)]
NOT_UTF8 = b"caf\xe9"  # latin-1 bytes


def jsonl_bytes(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


@pytest.mark.parametrize(("line_5", "reason"), [
    (b'{"text": "broken', "invalid JSON"),
    (b'{"text": "' + NOT_UTF8 + b'", "label": "a"}', r"bytes that are not UTF-8 \(0xe9 at character 14\)"),
    (b'{"text": "no label"}', "no 'label' value"),
    (b'{"label": "a"}', r"no 'text' field; the row's fields are \['label'\]"),
    (b'["a", "list"]', "expected a JSON object per line"),
], ids=["broken-json", "not-utf8", "no-label", "no-text", "not-an-object"])
def test_jsonl_bad_row_stops_at_its_line_or_is_skipped(tmp_path, line_5, reason):
    path = tmp_path / "train.jsonl"
    path.write_bytes(jsonl_bytes(GOOD[:4]) + line_5 + b"\n" + jsonl_bytes(GOOD[4:]))
    with pytest.raises(DataError, match=f"^{path}:5: {reason}"):
        read_table(path, label_required=True)

    skipped = BadRows("skip")
    examples = read_table(path, label_required=True, bad_rows=skipped)
    assert [e.text for e in examples] == [row["text"] for row in GOOD]
    assert [(r["line"], r["file"]) for r in skipped.records()] == [(5, str(path))]


def test_tsv_and_csv_bad_rows_name_their_line(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_bytes(b"text\tlabel\nfine\ta\n" + NOT_UTF8 + b"\ta\nthree\tfields\textra\nlast\tb\n")
    with pytest.raises(DataError, match=f"^{tsv}:3: bytes that are not UTF-8 \\(0xe9 at character 4\\)"):
        read_table(tsv)
    skipped = BadRows("skip")
    assert [e.text for e in read_table(tsv, bad_rows=skipped)] == ["fine", "last"]
    assert [r["line"] for r in skipped.records()] == [3, 4]
    assert "3 fields but the header has 2" in skipped.records()[1]["reason"]

    csv = tmp_path / "train.csv"
    csv.write_bytes(b'text,label\n"a quoted\nline break",a\n' + NOT_UTF8 + b",b\nok,b\n")
    with pytest.raises(DataError, match=f"^{csv}:4: bytes that are not UTF-8"):
        read_table(csv)
    skipped = BadRows("skip")
    assert [e.text for e in read_table(csv, bad_rows=skipped)] == ["a quoted\nline break", "ok"]
    assert [r["line"] for r in skipped.records()] == [4]


def test_a_missing_column_or_an_empty_file_stops_even_when_skipping(tmp_path):
    no_label = tmp_path / "train.csv"
    no_label.write_text("sentence,label\nhello,a\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train.csv:1: no 'text' column; the columns are \['sentence', 'label'\] "
                                        r"\(name yours with --text-column\)"):
        read_table(no_label, bad_rows=BadRows("skip"))
    unlabelled = tmp_path / "unlabelled.tsv"
    unlabelled.write_text("text\nhello\n", encoding="utf-8")
    with pytest.raises(DataError, match="no 'label' column"):
        read_table(unlabelled, label_required=True, bad_rows=BadRows("skip"))
    assert read_table(unlabelled)[0].label is None  # a file read for its texts only needs no label

    empty = tmp_path / "empty.conll"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match="no sentences found"):
        read_conll(empty, bad_rows=BadRows("skip"))


def test_a_regression_label_must_be_a_finite_number(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_text('{"text": "a", "label": 1.5}\n{"text": "b", "label": "nan"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=f"^{path}:2: label 'nan' is not a finite number"):
        read_table(path, regression=True)


def test_conll_bad_line_makes_its_sentence_a_bad_row(tmp_path):
    path = tmp_path / "train.conll"
    path.write_bytes(b"-DOCSTART- O\n\nJohn B-PER\nlives O\n\nParis B-LOC\n" + NOT_UTF8 + b" O\nis O\n\n"
                     b"Anna B-PER\nsmiles X-BAD\n\nBerlin B-LOC\n")
    with pytest.raises(DataError, match=f"^{path}:7: bytes that are not UTF-8"):
        read_conll(path)
    skipped = BadRows("skip")
    sentences = read_conll(path, bad_rows=skipped)
    assert [s.tokens for s in sentences] == [["John", "lives"], ["Berlin"]]
    assert [r["line"] for r in skipped.records()] == [7, 11]
    assert "tag 'X-BAD' is not O, B-TYPE or I-TYPE" in skipped.records()[1]["reason"]


def squad_question(qid: str, answer_start: int = 0) -> dict:
    return {"id": qid, "question": f"question {qid}?", "answers": [{"text": "abc", "answer_start": answer_start}]}


def test_squad_bad_question_names_its_line_and_is_skipped(tmp_path):
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "abcdef", "qas": [squad_question("q1"), squad_question("q2", answer_start=9),
                                      squad_question("q3")]}]}]}
    path = tmp_path / "train.json"
    text = json.dumps(data, indent=1)
    path.write_text(text, encoding="utf-8")
    line_of_q2 = next(n for n, line in enumerate(text.splitlines(), 1) if '"q2"' in line)
    with pytest.raises(DataError, match=rf"^{path}:{line_of_q2}: data\[0\]\.paragraphs\[0\]\.qas\[1\]: "
                                        r"question 'q2': answers\[0\] spans characters 9\.\.12"):
        read_squad(path)
    skipped = BadRows("skip")
    assert [q.id for q in read_squad(path, bad_rows=skipped)] == ["q1", "q3"]
    assert [r["line"] for r in skipped.records()] == [line_of_q2]


def test_squad_undecodable_bytes_and_broken_json_name_the_line(tmp_path):
    path = tmp_path / "train.json"
    path.write_bytes(b'{"version": "1.1",\n "data": [\n  {"title": "' + NOT_UTF8 + b'", "paragraphs": []}]}\n')
    with pytest.raises(DataError, match=f"^{path}:3: bytes that are not UTF-8 \\(0xe9 at character 17\\)"):
        read_squad(path)
    path.write_text('{"version": "1.1",\n "data": [\n  {"title": "t",, }]}\n', encoding="utf-8")
    with pytest.raises(DataError, match=f"^{path}:3: invalid JSON"):
        read_squad(path)
