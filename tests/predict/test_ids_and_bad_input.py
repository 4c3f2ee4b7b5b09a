"""`berth predict` keeps the input's id type (a join of the output on the input matches every row), turns rows it
cannot read into error rows with their line number and finishes, and never writes over its input."""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq

from tests.predict.conftest import read_output, run_predict, write_jsonl

TEXTS = ["a gripping, beautifully acted film .", "dull and far too long .", "it 's a charming journey .",
         "the plot makes no sense at all .", "one of the best films of the year ."]


def joined(inputs: list[dict], outputs: list[dict]) -> list[tuple[dict, dict]]:
    """Inner join on id, as a user's code would do it (the same value and the same type)."""
    by_id = {(type(row["id"]), row["id"]): row for row in outputs}
    return [(row, by_id[(type(row["id"]), row["id"])]) for row in inputs if (type(row["id"]), row["id"]) in by_id]


def test_integer_and_string_ids_keep_their_type_in_jsonl_and_parquet_output(bundle_repository, tmp_path):
    bundle = str(bundle_repository / "sentiment")
    for ids in ([0, 1, 2, 3, 4], ["0", "1", "a2", "b3", "c4"]):
        rows = [{"id": i, "text": t} for i, t in zip(ids, TEXTS)]
        source = write_jsonl(tmp_path / "in.jsonl", rows)
        for out in (tmp_path / "out.jsonl", tmp_path / "out.parquet"):
            run_predict(bundle, str(source), "--out", str(out), "--restart")
            output = read_output(out)
            assert [row["id"] for row in output] == ids  # 0 stays 0, "0" stays "0"
            assert len(joined(rows, output)) == len(rows)
    assert pq.read_schema(tmp_path / "out.parquet").field("id").type == pa.string()


def test_a_csv_integer_id_column_stays_integer_and_parquet_keeps_its_arrow_type(bundle_repository, tmp_path):
    bundle = str(bundle_repository / "sentiment")
    source = tmp_path / "in.csv"
    with open(source, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text"])
        writer.writerows([[10 * i, t] for i, t in enumerate(TEXTS)])
    out = tmp_path / "csv-out.parquet"
    run_predict(bundle, str(source), "--out", str(out))
    assert pq.read_schema(out).field("id").type == pa.int64()
    assert [row["id"] for row in read_output(out)] == [0, 10, 20, 30, 40]

    table = pa.table({"id": pa.array([7, 8, 9, 10, 11], pa.int32()), "text": TEXTS})
    pq.write_table(table, tmp_path / "in.parquet")
    out = tmp_path / "pq-out.parquet"
    run_predict(bundle, str(tmp_path / "in.parquet"), "--out", str(out))
    assert pq.read_schema(out).field("id").type == pa.int32()
    assert len(joined(table.to_pylist(), read_output(out))) == 5


def test_a_csv_column_with_one_non_integer_id_is_text_throughout(bundle_repository, tmp_path):
    source = tmp_path / "in.csv"
    source.write_text("id,text\n1,good film .\nx2,bad film .\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    run_predict(str(bundle_repository / "sentiment"), str(source), "--out", str(out))
    assert [row["id"] for row in read_output(out)] == ["1", "x2"]


def test_jsonl_ids_of_mixed_types_are_refused_before_the_run(bundle_repository, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "text": "good"}, {"id": "2", "text": "bad"}])
    code, _, stderr = run_predict(str(bundle_repository / "sentiment"), str(source), "--out",
                                  str(tmp_path / "out.jsonl"), check=False)
    assert code == 2
    assert "mixes types" in stderr and "first at row 1" in stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_undecodable_and_oversized_csv_rows_are_error_rows_with_line_numbers(bundle_repository, tmp_path):
    source = tmp_path / "in.csv"
    huge = "word " * 40_000  # 200,000 characters in one field: over the csv module's default limit
    source.write_bytes(b"id,text\n1,good film .\n2,bad \xff\xfe bytes\n3,fine again .\n"
                       + f'4,"{huge}"\n5,last one .\n'.encode())
    out = tmp_path / "out.jsonl"
    _, summary, _ = run_predict(str(bundle_repository / "sentiment"), str(source), "--out", str(out))
    assert summary["rows"] == 5
    errors = [json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()]
    assert [(e["id"], e["line"]) for e in errors] == [(None, 3)]
    assert "not valid UTF-8" in errors[0]["reason"] and "0xff" in errors[0]["reason"]
    # The long field is a row like any other: the model reads its first max_seq_length tokens (truncation).
    assert [row["id"] for row in read_output(out)] == [1, 3, 4, 5]
    # A rerun of the same job finishes too (nothing left to do: the parts are reused).
    _, again, _ = run_predict(str(bundle_repository / "sentiment"), str(source), "--out", str(out))
    assert again["rows"] == 5


def test_a_jsonl_line_with_a_lone_surrogate_escape_says_so(bundle_repository, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": 1, "text": "fine ."}\n{"id": 2, "text": "half \\ud800 a pair"}\n{"id": 3, "text": "ok"',
                      encoding="utf-8")
    out = tmp_path / "out.jsonl"
    run_predict(str(bundle_repository / "sentiment"), str(source), "--out", str(out))
    errors = [json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()]
    assert [(e["row"], e["line"]) for e in errors] == [(1, 2), (2, 3)]
    assert "unpaired surrogate" in errors[0]["reason"] and "\\ud800" in errors[0]["reason"]
    assert errors[1]["reason"].startswith("not valid JSON")


def test_an_output_that_is_the_input_is_refused_before_anything_is_written(bundle_repository, tmp_path):
    source = write_jsonl(tmp_path / "reviews.jsonl", [{"id": 1, "text": "good film ."}])
    before = source.read_bytes()
    (tmp_path / "link.jsonl").symlink_to(source)
    for out in (source, tmp_path / "." / "reviews.jsonl", tmp_path / "link.jsonl"):
        code, _, stderr = run_predict(str(bundle_repository / "sentiment"), str(source), "--out", str(out),
                                      check=False)
        assert code == 2 and "refusing to write over the input" in stderr
    assert source.read_bytes() == before
    assert not (tmp_path / "reviews.jsonl.parts").exists()
