"""A killed `berth predict` resumes to the output an uninterrupted run writes; bad rows never stop a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from tests.predict.conftest import REPO, read_output, run_predict, write_jsonl


def sentences(shared_data, count: int) -> list[str]:
    with open(shared_data / "sst2" / "train.tsv", encoding="utf-8") as f:
        return [line.split("\t")[0] for _, line in zip(range(count), f.read().splitlines()[1:])]


def test_a_run_killed_mid_way_resumes_to_the_uninterrupted_output(shared_data, bundle_repository, tmp_path):
    texts = sentences(shared_data, 3000)
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)])
    common = [str(bundle_repository / "sentiment"), str(source), "--window", "64", "--threads", "1"]
    whole = tmp_path / "whole.parquet"
    run_predict(*common[:-2], "--out", str(whole), "--window", "64")

    out = tmp_path / "killed.parquet"
    manifest = tmp_path / "killed.parquet.parts" / "manifest.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    process = subprocess.Popen([sys.executable, "-m", "berth.cli", "predict", *common, "--out", str(out)], cwd=REPO,
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if manifest.is_file() and len(json.loads(manifest.read_text())["parts"]) >= 5:
                break
            time.sleep(0.02)
        assert process.poll() is None, "the run ended before it could be killed"
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    assert not out.exists()
    done = json.loads(manifest.read_text())["parts"]
    assert 5 <= len(done) < 3000 // 64
    # a part file that the manifest does not list (a write the kill cut short) is never taken as done
    (manifest.parent / f"part-{len(done):05d}.parquet").write_bytes(b"PAR1 cut short")

    _, summary, _ = run_predict(*common[:-2], "--out", str(out), "--window", "64")
    assert summary["resumed_parts"] >= len(done) and summary["rows"] == 3000 and summary["written"] == 3000
    assert not manifest.parent.exists()
    got, expected = read_output(out), read_output(whole)
    assert [r["id"] for r in got] == [f"t{i}" for i in range(3000)]
    assert [(r["id"], r["label"], r["truncated"]) for r in got] == [(r["id"], r["label"], r["truncated"])
                                                                      for r in expected]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(got, expected)) < 1e-5


def test_parts_of_another_job_are_not_reused(bundle_repository, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": f"a fine film number {i}"} for i in range(20)])
    out = tmp_path / "out.jsonl"
    run_predict(str(bundle_repository / "sentiment"), str(source), "--out", str(out), "--window", "8", "--keep-parts")
    code, _, stderr = run_predict(str(bundle_repository / "sentiment"), str(source), "--out", str(out), "--window", "4",
                                  check=False)
    assert code == 2 and "--restart" in stderr
    _, summary, _ = run_predict(str(bundle_repository / "sentiment"), str(source), "--out", str(out), "--window", "4",
                                "--restart")
    assert summary["resumed_parts"] == 0 and summary["written"] == 20


def errors_of(out) -> list[dict]:
    path = out.with_name(out.name + ".errors.jsonl")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_bad_rows_go_to_the_errors_file_and_the_run_completes(bundle_repository, tmp_path):
    long_text = " ".join(["a truly wonderful and moving film"] * 40)
    lines = [json.dumps({"id": "ok1", "text": "a gorgeous, witty, seductive movie."}),
             json.dumps({"id": "missing", "title": "no text here"}),
             json.dumps({"id": "empty", "text": "   "}),
             json.dumps({"id": "number", "text": 42}),
             "{not json",
             "[1, 2]",
             json.dumps({"id": "long", "text": long_text}),
             json.dumps({"id": "ok2", "text": "unflinchingly bleak and desperate"})]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    out = tmp_path / "out.parquet"
    _, summary, stderr = run_predict(str(bundle_repository / "sentiment"), str(source), "--out", str(out),
                                     "--no-truncate", "--window", "3")
    assert (summary["rows"], summary["written"], summary["errors"]) == (8, 2, 6)
    assert "6 bad rows" in stderr
    assert [(r["id"], r["row"]) for r in read_output(out)] == [("ok1", 0), ("ok2", 7)]
    errors = errors_of(out)
    assert [(e["id"], e["row"]) for e in errors] == [("missing", 1), ("empty", 2), ("number", 3), (None, 4),
                                                     (None, 5), ("long", 6)]
    reasons = [e["reason"] for e in errors]
    assert "missing column 'text'" in reasons[0]
    assert "empty or only whitespace" in reasons[1]
    assert "not text" in reasons[2]
    assert "not valid JSON" in reasons[3] and "not a JSON object" in reasons[4]
    assert "tokens long" in reasons[5] and "at most 64" in reasons[5]


def test_fill_mask_and_qa_refusals_are_bad_rows(bundle_repository, tmp_path):
    source = write_jsonl(tmp_path / "masks.jsonl", [{"text": "Paris is the [MASK] of France."},
                                                    {"text": "no mask in this one"},
                                                    {"text": "The [MASK] sat on the mat."}])
    out = tmp_path / "masks.jsonl.out.jsonl"
    _, summary, _ = run_predict(str(bundle_repository / "masker"), str(source), "--out", str(out))
    assert (summary["written"], summary["errors"]) == (2, 1)
    assert [r["row"] for r in read_output(out)] == [0, 2]
    assert errors_of(out)[0]["row"] == 1 and "[MASK]" in errors_of(out)[0]["reason"]

    context = "The Normans gave their name to Normandy, a region in France."
    source = tmp_path / "qa.csv"
    source.write_text("question,context\nWhere is Normandy?," + json.dumps(context) + "\n"
                      + " ".join(["why"] * 200) + "," + json.dumps(context) + "\n" + "What region?\n",
                      encoding="utf-8")
    out = tmp_path / "qa.jsonl"
    _, summary, _ = run_predict(str(bundle_repository / "reader"), str(source), "--out", str(out))
    assert (summary["written"], summary["errors"]) == (1, 2)
    assert read_output(out)[0]["answer"] == context[read_output(out)[0]["start"] : read_output(out)[0]["end"]]
    reasons = {e["row"]: e["reason"] for e in errors_of(out)}
    assert "max_query_length" in reasons[1] and "missing column 'context'" in reasons[2]
