"""Engine benchmark: sequences/s and latency of one BERT forward, by batch size and sequence length.

Engines, side by side in one run:
- `pytorch`: PyTorch eager (training/bert/model.py, SDPA attention, inference_mode);
- `ort-plain`: ONNX Runtime on the exported graph (the session's own graph optimizations on, as served);
- `ort-optimized`: ONNX Runtime on the graph after the offline transformer optimizer (fused Attention,
  EmbedLayerNormalization, SkipLayerNormalization, BiasGelu);
- `ort-int8`: dynamic int8 quantization of the plain graph (what `berth export --precision int8` ships
  when the plain graph is the faster fp32 one), and `ort-int8-optimized` of the optimized graph.

Models: the embedded default base (all-MiniLM-L6-v2, L6/H384, real weights) and a BERT-base-sized
model (L12/H768, random weights: speed does not depend on the values). Each cell times every engine
in alternating rounds of short blocks (A B C D, A B C D, ...), so a burst of load from a neighbour
hurts all engines alike; the figure is the median run. Usage, from the repository root:

    .venv/bin/python -m bench.engine                      # the full grid, ~15 min on 2 cores
    .venv/bin/python -m bench.engine --quick              # a smoke run
    .venv/bin/python -m bench.engine --models base-l6 --batch-sizes 8 --seq-lengths 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import machine_facts

RESULTS = Path(__file__).resolve().parent / "results"
ENGINES = ("pytorch", "ort-plain", "ort-optimized", "ort-int8", "ort-int8-optimized")
MODELS = ("base-l6", "bert-base")
# BERT-base at 32 x 384 is ~2.4 TFLOP a batch (~20 s here): left out of the full grid to bound the run.
SKIP = {("bert-base", 32, 384)}


def build_model(name: str):
    """The PyTorch model (sequence classification head, 2 labels, eval mode) of a benchmark model name."""
    import torch

    from training.bert.checkpoint import default_base_path, load_pretrained
    from training.bert.config import BertConfig
    from training.bert.model import BertForSequenceClassification

    torch.manual_seed(0)
    if name == "base-l6":
        model, _ = load_pretrained(BertForSequenceClassification, default_base_path(), id2label={0: "0", 1: "1"})
    elif name == "bert-base":
        model = BertForSequenceClassification(BertConfig.preset("base", id2label={0: "0", 1: "1"}))
    else:
        raise ValueError(f"unknown model {name!r}; choose from {MODELS}")
    return model.eval()


def build_graphs(model, folder: Path) -> dict[str, Path]:
    """plain, optimized, int8 (of plain) and int8-optimized ONNX files of `model` in `folder`."""
    from export.onnx_export import export_onnx
    from export.optimize import optimize_bert
    from export.precision import to_int8

    plain = export_onnx(model, "classification", folder / "plain.onnx")
    optimized = folder / "optimized.onnx"
    fusions = optimize_bert(plain, optimized, model.config.num_attention_heads, model.config.hidden_size)
    print(f"  offline optimizer fusions: {fusions}", flush=True)
    return {
        "ort-plain": plain,
        "ort-optimized": optimized,
        "ort-int8": to_int8(plain, folder / "int8.onnx"),
        "ort-int8-optimized": to_int8(optimized, folder / "int8-optimized.onnx"),
    }


def make_runners(model, graphs: dict[str, Path], engines: list[str], threads: int) -> dict[str, Any]:
    """engine name -> a callable running one batch (a dict of int64 arrays)."""
    import torch

    from tasks.runtime.onnx_session import create_session

    runners: dict[str, Any] = {}
    for engine in engines:
        if engine == "pytorch":
            def run_torch(feeds, model=model):
                with torch.inference_mode():
                    return model(**{k: torch.from_numpy(v) for k, v in feeds.items()})["logits"]
            runners[engine] = run_torch
        else:
            precision = "int8" if "int8" in engine else "fp32"
            session, _ = create_session(graphs[engine], precision, intra_op_threads=threads)
            runners[engine] = lambda feeds, session=session: session.run(None, feeds)
    return runners


def time_cell(runners: dict[str, Any], feeds: dict[str, np.ndarray], min_rounds: int, max_rounds: int,
              budget_s: float, per_block: int = 2) -> dict[str, dict[str, float]]:
    """Rounds of blocks, one block per engine (A B C D, A B C D, ...), until `budget_s` or `max_rounds`.

    A block is one untimed run and `per_block` timed runs: the untimed run absorbs the previous
    engine's thread pool still spinning or sleeping, so each engine is timed on a settled machine.
    """
    times: dict[str, list[float]] = {name: [] for name in runners}
    started = time.perf_counter()
    for round_number in range(max_rounds):
        if round_number >= min_rounds and time.perf_counter() - started > budget_s:
            break
        for name, run in runners.items():
            run(feeds)
            for _ in range(per_block):
                begin = time.perf_counter()
                run(feeds)
                times[name].append(time.perf_counter() - begin)
    batch = feeds["input_ids"].shape[0]
    cell = {}
    for name, seconds in times.items():
        median = statistics.median(seconds)
        cell[name] = {"latency_ms": median * 1000, "min_latency_ms": min(seconds) * 1000,
                      "sequences_per_s": batch / median, "runs": len(seconds)}
    return cell


def busy_fraction(seconds: float = 1.0) -> float | None:
    """Share of the machine's CPU time used by others while this process sleeps `seconds` (/proc/stat)."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return idle, sum(fields)

    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def wait_for_quiet(max_busy: float, max_wait_s: float) -> float | None:
    """Wait (at most `max_wait_s`) until others use at most `max_busy` of the CPU; the last measure."""
    deadline = time.monotonic() + max_wait_s
    busy = busy_fraction()
    while busy is not None and busy > max_busy and time.monotonic() < deadline:
        time.sleep(4)
        busy = busy_fraction()
    return busy


def full_length_batch(batch_size: int, sequence_length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Real-shaped ids, no padding: every row is `sequence_length` tokens ([CLS] ... [SEP])."""
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(1000, 29000, (batch_size, sequence_length), dtype=np.int64)
    input_ids[:, 0], input_ids[:, -1] = 101, 102
    return {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids),
            "token_type_ids": np.zeros_like(input_ids)}


def markdown_table(results: list[dict[str, Any]], engines: list[str]) -> str:
    """One row per (model, batch, length): seq/s and ms per batch of each engine, ratios to ORT plain."""
    header = ["model", "batch x len"] + [f"{e} seq/s (ms)" for e in engines]
    ratio_engines = [e for e in engines if e != "ort-plain"]
    header += [f"{e} / ort-plain" for e in ratio_engines]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in results:
        cells = row["engines"]
        values = [row["model"], f"{row['batch_size']} x {row['sequence_length']}"]
        values += [f"{cells[e]['sequences_per_s']:.1f} ({cells[e]['latency_ms']:.0f})" for e in engines]
        if "ort-plain" in cells:
            plain = cells["ort-plain"]["sequences_per_s"]
            values += [f"{cells[e]['sequences_per_s'] / plain:.2f}x" for e in ratio_engines]
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--seq-lengths", nargs="+", type=int, default=[32, 128, 384])
    parser.add_argument("--threads", type=int, default=2, help="torch threads and ORT intra-op threads (default: 2)")
    parser.add_argument("--min-rounds", type=int, default=2, help="rounds of blocks (2 timed runs each) per cell")
    parser.add_argument("--max-rounds", type=int, default=6)
    parser.add_argument("--budget", type=float, default=6.0, help="seconds of timing per cell after min-rounds")
    parser.add_argument("--max-busy", type=float, default=0.15,
                        help="before each cell, wait until other processes use at most this share of the CPU")
    parser.add_argument("--max-wait", type=float, default=120, help="seconds to wait for a quiet machine per cell")
    parser.add_argument("--quick", action="store_true", help="smoke run: base-l6, batch 1 and 8, length 32, 1 round")
    parser.add_argument("--out", type=Path, default=RESULTS / "engine.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.batch_sizes, args.seq_lengths = ["base-l6"], [1, 8], [32]
        args.min_rounds, args.max_rounds = 1, 1

    import torch

    torch.set_num_threads(args.threads)
    facts = machine_facts(threads=args.threads)
    print(f"machine: {facts['cpu_model']} ({facts['usable_cores']} cores, flags {facts['cpu_flags']}), "
          f"threads {args.threads}, load {facts['load_average']}", flush=True)
    results: list[dict[str, Any]] = []
    fusions: dict[str, Any] = {}
    for model_name in args.models:
        print(f"{model_name}: building PyTorch and ONNX models", flush=True)
        model = build_model(model_name)
        with tempfile.TemporaryDirectory(prefix="berth-bench-") as scratch:
            graphs = build_graphs(model, Path(scratch))
            runners = make_runners(model, graphs, args.engines, args.threads)
            for batch_size in args.batch_sizes:
                for length in args.seq_lengths:
                    if (model_name, batch_size, length) in SKIP and not args.quick:
                        print(f"  {batch_size} x {length}: skipped (bounded run)", flush=True)
                        continue
                    busy = wait_for_quiet(args.max_busy, args.max_wait)
                    cell = time_cell(runners, full_length_batch(batch_size, length), args.min_rounds,
                                     args.max_rounds, args.budget)
                    results.append({"model": model_name, "batch_size": batch_size, "sequence_length": length,
                                    "others_cpu_share_before": busy, "engines": cell})
                    summary = ", ".join(f"{e} {c['sequences_per_s']:.1f}/s" for e, c in cell.items())
                    print(f"  {batch_size} x {length}: {summary} (others' CPU share before: {busy:.0%})", flush=True)
            del runners
        fusions[model_name] = {"hidden_size": model.config.hidden_size, "layers": model.config.num_hidden_layers}
    table = markdown_table(results, args.engines)
    print(table)
    report = {
        "benchmark": "engine",
        "command": "python -m bench.engine " + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
        "machine": {**facts, "load_average_after": list(__import__("os").getloadavg())},
        "settings": {"threads": args.threads, "ort_session": "graph optimization ALL, intra-op threads = threads, "
                     "inter-op 1, sequential", "torch": "eager, SDPA attention, inference_mode",
                     "inputs": "full-length rows (no padding), random token ids", "int8":
                     "dynamic quantization, int8 weights per channel, reduce_range", "min_rounds": args.min_rounds,
                     "max_rounds": args.max_rounds, "budget_s": args.budget},
        "models": fusions,
        "results": results,
        "table_markdown": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
