"""Where int8 drift comes from, and which quantization recipe removes it, measured on a fine-tuned model.

For one fine-tuned folder: export the plain fp32 graph, then
1. sensitivity: dynamic-quantize ONE group at a time (the embedding lookups; per layer the MatMuls of
   query/key/value, attention output, FFN intermediate, FFN output; the head) and measure how far the task outputs
   move from fp32 on dev inputs (mean and max |Δ|);
2. recipes: quantize the whole graph with each candidate recipe (export/precision.py RECIPES) and
   measure the outputs' drift, the task metric on the dev slice, and speed (batch 1 x 32 and 8 x 128)
   beside fp32, side by side.

    .venv/bin/python -m bench.int8_drift runs/sst2 --dev ../shared/data/sst2/dev.tsv \
        --train ../shared/data/sst2/train.tsv --limit 872
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import machine_facts
from tasks.registry import definition

RESULTS = Path(__file__).resolve().parent / "results"
def drift(reference: list[dict[str, np.ndarray]], candidate: list[dict[str, np.ndarray]],
          masks: list[np.ndarray], token_outputs: set[str]) -> dict[str, float]:
    """|Δ| over every output value; an output with a row per token only at the real tokens' rows."""
    diffs = []
    for ref, cand, mask in zip(reference, candidate, masks):
        for name in ref:
            d = np.abs(ref[name].astype(np.float64) - cand[name])
            diffs.append(d[mask.astype(bool)] if name in token_outputs else d)
    flat = np.concatenate([d.ravel() for d in diffs])
    return {"mean_abs_diff": float(flat.mean()), "max_abs_diff": float(flat.max())}


def run_all(session, batches: list[dict[str, np.ndarray]], output_names) -> list[dict[str, np.ndarray]]:
    return [dict(zip(output_names, session.run(list(output_names), feeds))) for feeds in batches]


def speed(session, shapes: list[tuple[int, int]], vocab_size: int, rounds: int = 5) -> dict[str, float]:
    from export.optimize import synthetic_batch, time_session

    return {f"{batch}x{length}": float(np.median(time_session(session, synthetic_batch(batch, length, vocab_size),
                                                              repeats=rounds)))
            for batch, length in shapes}


def main(argv: list[str] | None = None) -> int:
    import torch

    from bench.int8_accuracy import onnx_engine
    from export import calibration, precision
    from export.onnx_export import export_onnx, load_finetuned
    from tasks.runtime.onnx_session import create_session
    from tasks.runtime.tokenizer import load_tokenizer
    from training.finetuning import task_data
    from training.finetuning.finetune import FinetuneSettings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="?")
    parser.add_argument("--dev", type=Path)
    parser.add_argument("--train", type=Path, help="training file: calibration data")
    parser.add_argument("--limit", type=int, default=500, help="dev examples scored")
    parser.add_argument("--drift-examples", type=int, default=64, help="dev examples for the drift figures")
    parser.add_argument("--recipes", nargs="+", default=list(precision.RECIPES))
    parser.add_argument("--no-sensitivity", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--markdown", action="store_true", help="print the docs tables from bench/results and exit")
    parser.add_argument("--gate-table", type=Path, metavar="REPOSITORY",
                        help="print the int8 gate figures of the bundles in REPOSITORY and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(sorted(RESULTS.glob("int8_drift-*.json"))))
        return 0
    if args.gate_table:
        print(gate_table(args.gate_table))
        return 0
    if not (args.folder and args.dev and args.train):
        parser.error("folder, --dev and --train are needed (or --markdown)")

    torch.set_num_threads(args.threads)
    model, spec, _ = load_finetuned(args.folder)
    tokenizer = load_tokenizer(args.folder)
    settings = FinetuneSettings(task=spec.task, train_file=args.train, out=args.folder,
                                regression=spec.problem_type == "regression", max_seq_length=spec.max_seq_length,
                                doc_stride=spec.doc_stride, max_query_length=spec.max_query_length)
    adapter = task_data.adapter_for(settings, tokenizer)
    dev = adapter.read(args.dev, limit=args.limit, seed=None)
    drift_items = calibration.model_inputs(spec, tokenizer, args.dev, args.drift_examples)
    batches = calibration.batches(drift_items)
    masks = [b["attention_mask"] for b in batches]
    names = list(definition(spec.task).output_names)
    token_outputs = {name for name in names if definition(spec.task).is_token_output(name)}
    report: dict[str, Any] = {"model": str(args.folder.resolve()), "task": spec.task, "dev": str(args.dev),
                              "dev_examples": len(dev), "drift_inputs": len(drift_items)}
    with tempfile.TemporaryDirectory(prefix="berth-drift-") as scratch_name:
        scratch = Path(scratch_name)
        plain = export_onnx(model, spec.task, scratch / "fp32.onnx")
        fp32, _ = create_session(plain, "fp32", args.threads)
        reference = run_all(fp32, batches, names)

        if not args.no_sensitivity:
            sensitivity = {}
            groups = {"embeddings": (precision.embedding_gathers(plain), ("Gather",)),
                      **{role: (nodes, ("MatMul",)) for role, nodes in precision.matmul_roles(plain).items()}}
            for group, (nodes, op_types) in groups.items():
                target = precision.quantize_dynamic_nodes(plain, scratch / "one.onnx", nodes, op_types)
                session, _ = create_session(target, "int8", args.threads)
                sensitivity[group] = drift(reference, run_all(session, batches, names), masks, token_outputs)
                print(f"only {group:12s} quantized: mean |Δ| {sensitivity[group]['mean_abs_diff']:.4f}  "
                      f"max |Δ| {sensitivity[group]['max_abs_diff']:.4f}", flush=True)
            report["sensitivity"] = sensitivity

        calib = calibration.batches(calibration.model_inputs(spec, tokenizer, args.train, calibration.DEFAULT_EXAMPLES))
        fp32_metrics, _ = adapter.evaluate(onnx_engine(plain, "fp32", args.threads)[0], dev, spec)
        report["fp32"] = {"metrics": fp32_metrics,
                          "seconds": speed(fp32, [(1, 32), (8, 128)], model.config.vocab_size)}
        print(f"fp32: {_headline(fp32_metrics)} {report['fp32']['seconds']}", flush=True)
        report["recipes"] = {}
        for name in args.recipes:
            started = time.perf_counter()
            target = precision.to_int8(plain, scratch / f"{name}.onnx", recipe=name, calibration_feeds=calib)
            build = time.perf_counter() - started
            session, _ = create_session(target, "int8", args.threads)
            figures = drift(reference, run_all(session, batches, names), masks, token_outputs)
            metrics, _ = adapter.evaluate(onnx_engine(target, "int8", args.threads)[0], dev, spec)
            seconds = speed(session, [(1, 32), (8, 128)], model.config.vocab_size)
            ratio = {k: report["fp32"]["seconds"][k] / v for k, v in seconds.items()}
            report["recipes"][name] = {**figures, "metrics": metrics, "seconds": seconds, "speedup_vs_fp32": ratio,
                                       "build_seconds": round(build, 1)}
            print(f"{name:24s} mean |Δ| {figures['mean_abs_diff']:.4f} max |Δ| {figures['max_abs_diff']:.3f}  "
                  f"{_headline(metrics)}  speed x{ratio['1x32']:.2f} (1x32) x{ratio['8x128']:.2f} (8x128)", flush=True)
    report["machine"] = machine_facts(threads=args.threads)
    out = args.out or RESULTS / f"int8_drift-{args.folder.resolve().name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


def _metric(task: str, metrics: dict[str, float]) -> tuple[str, float]:
    name, scale = definition(task).headline_metric(metrics)
    return name, metrics[name] * scale


def markdown(paths: list[Path]) -> str:
    """The docs/ENGINE.md tables from int8_drift records: recipes per model, then the sensitivity."""
    records = [json.loads(p.read_text(encoding="utf-8")) for p in paths]
    lines = ["| model (task) | dev examples | recipe | metric | fp32 | int8 | int8 − fp32 (points) "
             "| mean / max abs Δ output | int8 speed-up 1×32 / 8×128 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        name, fp32 = _metric(r["task"], r["fp32"]["metrics"])
        for recipe, figures in r["recipes"].items():
            value = _metric(r["task"], figures["metrics"])[1]
            speed = figures["speedup_vs_fp32"]
            lines.append(f"| {Path(r['model']).name} ({r['task']}) | {r['dev_examples']} | {recipe} | {name} | "
                         f"{fp32:.2f} | {value:.2f} | {value - fp32:+.2f} | {figures['mean_abs_diff']:.4f} / "
                         f"{figures['max_abs_diff']:.3f} | {speed['1x32']:.2f}× / {speed['8x128']:.2f}× |")
    for r in records:
        if "sensitivity" not in r:
            continue
        ranked = sorted(r["sensitivity"].items(), key=lambda kv: -kv[1]["mean_abs_diff"])
        total = sum(v["mean_abs_diff"] for _, v in ranked)
        lines += ["", f"Sensitivity, {Path(r['model']).name} ({r['task']}): one group quantized at a time (dynamic "
                  f"int8), the rest fp32, {r['drift_inputs']} dev inputs; the six largest of {len(ranked)} groups:", "",
                  "| group | mean abs Δ output | share of the sum | max abs Δ output |", "|---|---|---|---|"]
        for group, v in ranked[:6]:
            lines.append(f"| {group} | {v['mean_abs_diff']:.4f} | {100 * v['mean_abs_diff'] / total:.0f}% | "
                         f"{v['max_abs_diff']:.3f} |")
    return "\n".join(lines)


def gate_table(repository: Path) -> str:
    """The int8 gate's figures from the manifests of a model repository's bundles."""
    lines = ["| bundle | task | recipe | agreement, all examples | agreement where PyTorch is confident | metric "
             "(dev examples) | PyTorch | int8 | Δ points (≥ −0.5) | passed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for manifest in sorted([*repository.glob("*/bundle.json"), *repository.glob("*.bundle.json")]):
        record = json.loads(manifest.read_text(encoding="utf-8"))
        p, m = record["parity"], record["parity"].get("metric") or {}
        recipe = (record.get("optimization", {}).get("int8") or {}).get("recipe", record["precision"])
        lines.append(f"| {record['name']} | {record['task']} | {recipe} | "
                     f"{100 * p['agreement']:.1f}% of {p['examples']} | "
                     f"{100 * p['confident_agreement']:.1f}% of {p['confident_examples']} | {m.get('name', '–')} "
                     f"({m.get('examples', '–')}) | {m.get('reference', float('nan')):.2f} | "
                     f"{m.get('candidate', float('nan')):.2f} | {m.get('delta_points', float('nan')):+.2f} | "
                     f"{'yes' if p['passed'] else 'no'} |")
    return "\n".join(lines)


def _headline(metrics: dict[str, float]) -> str:
    keys = ("accuracy", "f1", "exact", "pearson")
    return " ".join(f"{k} {100 * metrics[k]:.2f}" if metrics[k] <= 1 else f"{k} {metrics[k]:.2f}"
                    for k in keys if k in metrics)


if __name__ == "__main__":
    raise SystemExit(main())
