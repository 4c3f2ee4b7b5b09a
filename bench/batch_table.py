"""The batch-size table the service batches by: items/s of the raw ONNX Runtime session by (length, batch size).

For each padded length (16 ... the bundle's max sequence length) it times one forward pass of a batch of
that many tokens per item at each batch size, and keeps, per length, the largest batch size that still
improves throughput by at least `--min-gain` over the best smaller one (past that, a larger batch only adds
latency). `berth serve --batch-table <file>` (BERTH_BATCH_TABLE) then gives each forward pass the table's
batch size for its padded length, capped by max_batch_size.

With `--threads-sweep` it also times the engine at a short and a long length with 1..cores intra-op threads,
spinning on and off (the numbers behind the service's `intra_op_threads` / `ort_spinning` defaults).

    .venv/bin/python -m bench.batch_table models/sst2 --out bench/results/batch_table-sst2.json --threads-sweep

Writes the table (and every measurement, with the machine facts) as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import machine_facts
from tasks.bundle_checks import load_bundle
from tasks.runtime.onnx_session import create_session

LENGTHS = (16, 32, 64, 128, 256, 384, 512)
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
LIBRARIES = ("onnxruntime", "numpy")


def feeds_of(batch: int, length: int, input_names: list[str]) -> dict[str, np.ndarray]:
    """A batch of real-token-only sequences (no padding: the padded width is what costs)."""
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(1000, 20000, size=(batch, length), dtype=np.int64),
             "attention_mask": np.ones((batch, length), np.int64),
             "token_type_ids": np.zeros((batch, length), np.int64)}
    return {name: feeds[name] for name in input_names}


def time_pass(session: Any, feeds: dict[str, np.ndarray], seconds: float) -> float:
    """Median seconds of one forward pass, timed for about `seconds` (at least 3 passes) after one warm-up."""
    session.run(None, feeds)
    times: list[float] = []
    begin = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - begin < seconds:
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def best_batch_size(rows: list[dict[str, Any]], min_gain: float) -> int:
    """The largest batch size whose items/s beats every smaller one's by at least `min_gain` (a fraction)."""
    best = rows[0]
    for row in rows[1:]:
        if row["items_per_s"] >= best["items_per_s"] * (1 + min_gain):
            best = row
    return int(best["batch_size"])


def measure_table(session: Any, lengths: list[int], batch_sizes: list[int], max_batch_tokens: int, seconds: float,
                  min_gain: float) -> dict[str, Any]:
    input_names = [node.name for node in session.get_inputs()]
    measured: dict[str, list[dict[str, Any]]] = {}
    best: dict[str, int] = {}
    for length in lengths:
        rows = []
        for batch in batch_sizes:
            if batch > 1 and batch * length > max_batch_tokens:
                break
            pass_s = time_pass(session, feeds_of(batch, length, input_names), seconds)
            rows.append({"batch_size": batch, "pass_ms": 1000 * pass_s, "items_per_s": batch / pass_s})
            print(f"length {length:4d} batch {batch:3d}: {1000 * pass_s:8.2f} ms/pass {batch / pass_s:8.1f} items/s",
                  flush=True)
        measured[str(length)] = rows
        best[str(length)] = best_batch_size(rows, min_gain)
    return {"best_batch_size": best, "measured": measured}


def threads_sweep(model: Any, precision: str, cores: int, lengths: tuple[int, int], seconds: float) -> list[dict]:
    """Batch-1 latency and batch-16 items/s at a short and a long length, per (threads, spinning)."""
    rows = []
    for threads in range(1, cores + 1):
        for spinning in (False, True):
            session, _ = create_session(model, precision, threads, prefer_gpu=False, allow_spinning=spinning)
            names = [node.name for node in session.get_inputs()]
            for length in lengths:
                one = time_pass(session, feeds_of(1, length, names), seconds)
                many = time_pass(session, feeds_of(16, length, names), seconds)
                row = {"threads": threads, "spinning": spinning, "length": length, "batch1_ms": 1000 * one,
                       "batch16_items_per_s": 16 / many}
                rows.append(row)
                print(f"threads {threads} spinning {spinning!s:5} length {length}: batch-1 {1000 * one:.2f} ms, "
                      f"batch-16 {16 / many:.1f} items/s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    import os

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path, help="a bundle folder (model.onnx + bundle.json)")
    parser.add_argument("--out", type=Path, help="the table JSON (default: bench/results/batch_table-<bundle>.json)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: the usable cores)")
    parser.add_argument("--spinning", action="store_true", help="let idle ORT threads busy-wait")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    parser.add_argument("--max-batch-tokens", type=int, default=8192, help="the service's token budget per pass")
    parser.add_argument("--seconds", type=float, default=0.5, help="timing per (length, batch size)")
    parser.add_argument("--min-gain", type=float, default=0.05,
                        help="a larger batch must add at least this share of items/s to be chosen")
    parser.add_argument("--threads-sweep", action="store_true", help="also time 1..cores threads, spinning on/off")
    args = parser.parse_args(argv)

    from tasks.runtime.cpu import usable_cpus

    bundle = load_bundle(args.bundle)
    cores = usable_cpus()
    threads = args.threads or cores
    lengths = sorted({min(length, bundle.spec().max_seq_length) for length in args.lengths})
    session, provider = create_session(bundle.model_path, bundle.precision, threads, prefer_gpu=False,
                                       allow_spinning=args.spinning)
    result: dict[str, Any] = {
        "bundle": args.bundle.name, "precision": bundle.precision, "provider": provider, "threads": threads,
        "spinning": args.spinning, "min_gain": args.min_gain, "max_batch_tokens": args.max_batch_tokens,
        "machine": machine_facts(threads, LIBRARIES), "load_average_start": list(os.getloadavg()),
        **measure_table(session, lengths, sorted(args.batch_sizes), args.max_batch_tokens, args.seconds,
                        args.min_gain),
    }
    if args.threads_sweep:
        result["threads_sweep"] = threads_sweep(bundle.model_path, bundle.precision, cores,
                                                (min(32, lengths[-1]), lengths[-1]), args.seconds)
    result["load_average_end"] = list(os.getloadavg())
    out = args.out or Path(__file__).resolve().parent / "results" / f"batch_table-{args.bundle.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print("best batch size by length:", json.dumps(result["best_batch_size"]))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
