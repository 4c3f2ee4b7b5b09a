"""The pretraining benchmarks' own parts: the memory meter on real child processes, the tweet text of the DAPT
run, the summary of its seeds and the doc block they are written into."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.dapt_wnut import summary, write_tweets
from bench.pretrain_memory import measured
from berth.sweep.report import replace_block

MB = 1 << 20


def test_meter_sees_a_childs_own_allocation_as_anonymous_memory(tmp_path: Path) -> None:
    child = "b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(0.6)"
    result = measured([sys.executable, "-c", child], tmp_path / "log")
    assert result["ru_maxrss_mb"] >= 300
    assert result["tree_peak_anon_mb"] >= 290
    assert result["tree_peak_file_mb"] < 100


def test_meter_counts_a_mapped_files_pages_as_file_backed_and_sees_grandchildren(tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(b"\1" * (200 * MB))
    reader = (f"import mmap, time; f = open({str(data)!r}, 'rb'); "
              "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); "
              "s = sum(m[i] for i in range(0, len(m), 4096)); time.sleep(0.6)")
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {reader!r}], check=True)"
    result = measured([sys.executable, "-c", parent], tmp_path / "log")
    assert result["processes"] == 2
    assert result["largest_worker_peak_mb"] >= 200  # the grandchild's pages, not the parent's
    assert result["tree_peak_file_mb"] >= 190
    assert result["tree_peak_anon_mb"] < 150


def test_tweets_are_the_tokens_of_btc_and_wnut_train_only(tmp_path: Path) -> None:
    (tmp_path / "btc").mkdir()
    (tmp_path / "wnut17").mkdir()
    (tmp_path / "btc" / "a.conll").write_text("I\tO\nlove\tO\nParis\tB-LOC\n\nok\tO\n", encoding="utf-8")
    (tmp_path / "wnut17" / "wnut17train.conll").write_text("@paul\tO\nhi\tO\n\t\n", encoding="utf-8")
    (tmp_path / "wnut17" / "emerging.dev.conll").write_text("secret\tO\n", encoding="utf-8")
    counts = write_tweets(tmp_path, tmp_path / "out")
    texts = {p.name: p.read_text(encoding="utf-8") for p in (tmp_path / "out").iterdir()}
    assert texts == {"btc-a.txt": "I love Paris\nok\n", "wnut17-wnut17train.txt": "@paul hi\n"}
    assert counts["tweets"] == 3


def test_summary_compares_the_mean_f1_of_the_two_starting_points() -> None:
    runs = [{"arm": "base", "dev_metrics": {"f1": f}} for f in (0.30, 0.34)] + \
           [{"arm": "dapt", "dev_metrics": {"f1": f}} for f in (0.35, 0.37)]
    result = summary(runs)
    assert abs(result["base"]["mean"] - 0.32) < 1e-12 and abs(result["dapt"]["mean"] - 0.36) < 1e-12
    assert abs(result["dapt_minus_base"] - 0.04) < 1e-12
    assert result["base"]["min"] == 0.30 and result["dapt"]["max"] == 0.37


def test_replace_block_rewrites_only_between_its_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- generated:x -->\nold\n<!-- /generated:x -->\nafter\n", encoding="utf-8")
    replace_block(page, "x", "| new |\n")
    assert page.read_text(encoding="utf-8") == "intro\n<!-- generated:x -->\n| new |\n<!-- /generated:x -->\nafter\n"
