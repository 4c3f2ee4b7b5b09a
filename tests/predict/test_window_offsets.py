"""Reading a window from the byte offset `row_offsets` finds (how `berth predict --ray` splits a file into
read tasks) gives the rows a reader gives from the top: CSV with quoted fields that span lines and blank lines, TSV
with a byte-order mark, JSON lines with bad lines, Parquet across row groups."""

from __future__ import annotations

import csv
import json
from itertools import islice

import pytest

from predict import io


def write_inputs(tmp_path) -> dict[str, object]:
    texts = [
        f"row {i}: " + ('a quoted, "multi\nline" text' if i % 7 == 0 else "plain text") for i in range(103)
    ]
    with open(tmp_path / "in.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text"])
        for i, text in enumerate(texts):
            writer.writerow([f"r{i}", text])
            if i % 10 == 3:
                f.write("\n")  # a blank line is not a row
    (tmp_path / "in.tsv").write_text(
        "\ufeffid\ttext\n" + "".join(f"r{i}\tplain {i}\n" for i in range(103)), encoding="utf-8"
    )
    lines = [json.dumps({"id": f"r{i}", "text": t}) if i % 11 else "{not json" for i, t in enumerate(texts)]
    (tmp_path / "in.jsonl").write_text("\n\n".join(lines) + "\n", encoding="utf-8")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"id": [f"r{i}" for i in range(103)], "text": texts}),
        tmp_path / "in.parquet",
        row_group_size=17,
    )
    return {
        "csv": tmp_path / "in.csv",
        "tsv": tmp_path / "in.tsv",
        "jsonl": tmp_path / "in.jsonl",
        "parquet": tmp_path / "in.parquet",
    }


@pytest.mark.parametrize("kind", ["csv", "tsv", "jsonl", "parquet"])
@pytest.mark.parametrize("skip", [0, 30])
def test_windows_read_from_their_offsets_are_the_rows_read_from_the_top(tmp_path, kind, skip):
    path = write_inputs(tmp_path)[kind]
    whole = list(io.open_reader(path, kind, ["id", "text"]).rows(skip))
    assert len(whole) == 103 - skip and whole[0][0] == skip
    offsets = io.row_offsets(io.open_reader(path, kind, ["id", "text"]), 16, skip)
    assert [number for number, _ in offsets] == list(range(skip, 103, 16))
    windows = []
    for number, offset in offsets:
        windows += list(islice(io.open_reader(path, kind, ["id", "text"]).rows(number, offset), 16))
    assert windows == whole
