"""Prepared pretraining data on real text: the same shards from 1 and 2 worker processes, a killed preparation
finished by a rerun, a changed shard refused, undecodable lines stopped at (file and line) or skipped and counted."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from berth.cli import main
from tasks.runtime.tokenizer import load_tokenizer
from training.bert.checkpoint import default_base_path
from training.errors import UserFacingError
from training.pretraining.corpus import read_documents
from training.pretraining.instances import build_pretraining_instances
from training.pretraining.shards import plan_pieces, prepare, shard_seed
from training.pretraining.stream import ShardedInstances

REPO = Path(__file__).resolve().parents[3]
SETTINGS = {"format": "text", "max_document_chars": 20_000, "max_seq_length": 64, "short_seq_prob": 0.1,
            "nsp": True, "dupe_factor": 1, "heldout_fraction": 0.1, "seed": 7, "encoding": "utf-8",
            "bad_lines": "stop"}
SHARD_MB = 0.05  # ~50 KB of text a shard: the 12 addresses (~200 KB) make several


@pytest.fixture(scope="module")
def corpus(shared_data) -> list[Path]:
    return sorted((shared_data / "pretraining" / "inaugural").glob("*.txt"))[:12]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(default_base_path())


def _npy_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.glob("shard-*/*.npy"))}


def test_one_and_two_workers_write_the_same_shards(corpus, tokenizer, tmp_path):
    one = prepare(corpus, tokenizer, tmp_path / "one", SETTINGS, shard_mb=SHARD_MB, workers=1)
    two = prepare(corpus, tokenizer, tmp_path / "two", SETTINGS, shard_mb=SHARD_MB, workers=2)
    assert len(one["shards"]) >= 3
    assert _npy_bytes(tmp_path / "one") == _npy_bytes(tmp_path / "two")
    assert one["digest"] == two["digest"] and one["totals"] == two["totals"]
    # Every corpus byte is in exactly one piece.
    pieces = plan_pieces(corpus, int(SHARD_MB * (1 << 20)))
    covered = sorted((p.path, p.start, p.end) for piece in pieces for p in piece)
    assert covered == sorted((str(f), 0, f.stat().st_size) for f in corpus)


def test_a_shard_holds_what_the_in_memory_pipeline_builds_from_its_files(corpus, tokenizer, tmp_path):
    manifest = prepare(corpus, tokenizer, tmp_path, SETTINGS, shard_mb=SHARD_MB)
    first = manifest["shards"][0]
    files = [part["path"] for part in json.loads((tmp_path / "shard-000000" / "shard.json").read_text())["piece"]]
    expected, heldout = build_pretraining_instances(
        read_documents(files), tokenizer, max_seq_length=64, heldout_fraction=0.1, seed=shard_seed(7, 0))
    stored = ShardedInstances(tmp_path, "train")
    assert first["train"]["instances"] == len(expected)
    for i in (0, len(expected) // 2, len(expected) - 1):
        ids, types = stored.sequence(i)
        want_ids, want_types = expected.sequence(i)
        assert np.array_equal(ids, want_ids) and np.array_equal(types, want_types)
        assert stored.nsp_label(i) == int(expected.next_sentence_labels[i])
    assert ShardedInstances(tmp_path, "heldout").counts[0] == len(heldout)


def test_a_large_file_is_cut_at_blank_lines(tmp_path):
    text = "".join(f"Paragraph {i} has words.\nAnd a wrapped line.\n\n" for i in range(5000))
    big = tmp_path / "big.txt"
    big.write_text(text, encoding="utf-8")
    pieces = plan_pieces([big], 20_000)
    assert len(pieces) > 5 and all(len(piece) == 1 for piece in pieces)
    data = big.read_bytes()
    assert b"".join(data[p.start:p.end] for piece in pieces for p in piece) == data
    assert all(data[p.start - 2:p.start] == b"\n\n" for piece in pieces[1:] for p in piece)


def test_a_changed_shard_is_refused_and_a_touched_one_is_not(corpus, tokenizer, tmp_path):
    prepare(corpus[:4], tokenizer, tmp_path, SETTINGS, shard_mb=SHARD_MB)
    ids = tmp_path / "shard-000000" / "train.input_ids.npy"
    os.utime(ids)  # touched, not changed: the checksum still matches
    assert len(ShardedInstances(tmp_path)) > 0
    data = bytearray(ids.read_bytes())
    data[-1] ^= 1  # one token id changed: same size, same counts
    ids.write_bytes(bytes(data))
    with pytest.raises(UserFacingError, match="changed since it was prepared"):
        ShardedInstances(tmp_path)


def _berth(*args: str) -> tuple[int, str]:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(list(args))
    return code, printed.getvalue()


def test_an_undecodable_line_stops_with_its_file_and_line_or_is_skipped_and_counted(corpus, tmp_path):
    bad = tmp_path / "corpus" / "bad.txt"
    bad.parent.mkdir()
    good = corpus[0].read_bytes()
    lines = good.split(b"\n")
    bad.write_bytes(b"\n".join(lines[:4] + [b"caf\xe9 au lait, in Latin-1"] + lines[4:]))
    (tmp_path / "corpus" / "other.txt").write_bytes(corpus[1].read_bytes())
    common = ["pretrain", str(tmp_path / "corpus"), "--base", "default", "--max-seq-length", "64", "--prepare-only"]
    code, printed = _berth(*common, "--out", str(tmp_path / "stop"))
    assert code == 2
    assert f"{bad}:5: not UTF-8 (byte 0xe9 at column 4)" in printed and "Traceback" not in printed
    assert not (tmp_path / "stop" / "data" / "manifest.json").exists()

    code, printed = _berth(*common, "--out", str(tmp_path / "skip"), "--bad-lines", "skip")
    assert code == 0
    manifest = json.loads((tmp_path / "skip" / "data" / "manifest.json").read_text())
    assert manifest["bad_lines"] == 1
    listed = [json.loads(line) for line in (tmp_path / "skip" / "data" / "bad_lines.jsonl").read_text().splitlines()]
    assert listed == [{"file": str(bad), "line": 5, "reason": "not UTF-8 (byte 0xe9 at column 4)"}]

    code, _ = _berth(*common, "--out", str(tmp_path / "latin1"), "--encoding", "utf-8-or-latin-1")
    manifest = json.loads((tmp_path / "latin1" / "data" / "manifest.json").read_text())
    assert code == 0 and manifest["bad_lines"] == 0
    assert [s["read_as_latin1"] for s in manifest["shards"]] == [[str(bad)]]


def test_a_killed_preparation_is_finished_by_the_same_command(corpus, tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "berth.cli", "pretrain", *map(str, corpus), "--out", str(out), "--base",
               "default", "--max-seq-length", "64", "--shard-mb", "0.03", "--prepare-only"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(out.glob("data/shard-*/shard.json"))) < 2:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    committed = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("data/shard-*/shard.json")}
    assert len(committed) >= 2 and not (out / "data" / "manifest.json").exists(), "the kill came too late"

    finished = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    assert manifest["prepared"]["shards_built"] == len(manifest["shards"]) - len(committed)
    assert {n: (out / "data" / n / "shard.json").stat().st_mtime_ns for n in committed} == committed  # kept
    clean = prepare(corpus, load_tokenizer(default_base_path()), tmp_path / "clean",
                    {**SETTINGS, "nsp": False, "seed": 12345, "heldout_fraction": 0.03}, shard_mb=0.03)
    assert manifest["digest"] == clean["digest"]  # the same bytes as a preparation never killed


def test_a_launch_that_may_not_prepare_says_to_prepare_first(corpus, tmp_path):
    from training.pretraining.prepared import prepare_run_data
    from training.pretraining.settings import PretrainSettings

    settings = PretrainSettings(corpus=corpus[:2], out=tmp_path / "out", tokenizer=default_base_path(),
                                max_seq_length=64)
    with pytest.raises(UserFacingError, match="no data is built inside a torchrun launch: prepare it first"):
        prepare_run_data(settings, None, True, may_build=False, has_training_state=False)
