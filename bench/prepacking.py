"""ONNX Runtime's weight prepacking, per bundle: speed with and without, side by side, and how far the answers move.

Prepacking keeps a packed copy of every constant GEMM weight per session (memory: `python -m bench.memory --idle
--policy shared --policy "shared, not prepacked"`); this measures what the copy buys. Per bundle, one session
with prepacking and one without (`session.disable_prepacking`), each as the service runs them: a 2-thread
session's batch-1 latency (a lone request) and 1-thread sessions' items/s at batch 16 (passes side by side under
load), on real SST-2 dev sentences; the two settings alternate round by round, medians over the rounds. Also the
largest difference between their outputs on the same batch.

    python -m bench.prepacking /tmp/repo/int8/sentiment /tmp/repo/fp32/sentiment --rounds 5 \
        --out bench/results/prepacking.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.local_processes import REPO
from bench.machine import machine_facts
from bench.service_load import SHARED_DATA


def session(path: Path, threads: int, prepack: bool) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def timed(run: Any, feeds: dict[str, np.ndarray], seconds: float) -> float:
    """Median seconds of one run over `seconds` (at least 3 runs)."""
    times, begin = [], time.perf_counter()
    while time.perf_counter() - begin < seconds or len(times) < 3:
        start = time.perf_counter()
        run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(folder: Path, rounds: int, seconds: float) -> dict[str, Any]:
    from tasks.bundle_checks import load_bundle
    from tasks.readers import read_sst2
    from tasks.registry import definition
    from tasks.runtime.batching import pad_batch
    from tasks.runtime.tokenizer import load_tokenizer

    bundle = load_bundle(folder)
    task = definition(bundle.task)
    texts = [e.text for e in read_sst2(SHARED_DATA / "sst2" / "dev.tsv")[:16]]
    items = [i for p in task.prepare_many(load_tokenizer(bundle.tokenizer_path), bundle.spec(), texts,
                                          task.options()) for i in p.items]
    one, sixteen = pad_batch(items[:1]), pad_batch(items[:16])
    sessions = {prepack: (session(bundle.model_path, 2, prepack), session(bundle.model_path, 1, prepack))
                for prepack in (True, False)}
    outputs = {prepack: wide.run(None, sixteen)[0] for prepack, (wide, _) in sessions.items()}
    figures: dict[bool, dict[str, list[float]]] = {p: {"batch1_ms": [], "batch16_items_per_s": []} for p in sessions}
    for round_ in range(rounds):
        for prepack in (True, False) if round_ % 2 == 0 else (False, True):
            wide, narrow = sessions[prepack]
            figures[prepack]["batch1_ms"].append(1000 * timed(wide.run, one, seconds))
            figures[prepack]["batch16_items_per_s"].append(16 / timed(narrow.run, sixteen, seconds))
    medians = {"prepacked" if p else "not_prepacked": {k: statistics.median(v) for k, v in f.items()}
               for p, f in figures.items()}
    return {"bundle": str(folder), "precision": bundle.precision,
            "int8_recipe": (bundle.optimization or {}).get("int8", {}).get("recipe") if bundle.optimization else None,
            "tokens": [len(i) for i in items], **medians, "rounds": {str(p): f for p, f in figures.items()},
            "max_abs_output_difference": float(np.abs(outputs[True] - outputs[False]).max()),
            "batch1_speedup": medians["not_prepacked"]["batch1_ms"] / medians["prepacked"]["batch1_ms"],
            "batch16_speedup": medians["prepacked"]["batch16_items_per_s"]
            / medians["not_prepacked"]["batch16_items_per_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per timing")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "prepacking.json")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"machine": machine_facts(2, ("onnxruntime", "numpy")), "rows": []}
    print("| bundle | precision | batch-1 ms prepacked / not | x | batch-16 items/s (1 thread) prepacked / not | x | "
          "max abs output difference |\n|---|---|---|---|---|---|---|")
    for folder in args.bundles:
        row = measure(folder, args.rounds, args.seconds)
        result["rows"].append(row)
        on, off = row["prepacked"], row["not_prepacked"]
        print(f"| {folder.name} | {row['precision']} | {on['batch1_ms']:.2f} / {off['batch1_ms']:.2f} | "
              f"{row['batch1_speedup']:.2f} | {on['batch16_items_per_s']:.0f} / {off['batch16_items_per_s']:.0f} | "
              f"{row['batch16_speedup']:.2f} | {row['max_abs_output_difference']:.2g} |", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
