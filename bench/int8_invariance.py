"""int8 recipes side by side on fine-tuned models: batch dependence, accuracy and speed, in one run.

For each model folder (a `berth finetune` output with its finetune_run.json): the plain fp32 graph and each
recipe's int8 graph are built as `berth export` builds them, then measured on the same inputs:
- batch dependence: `export.invariance.batch_invariance` on the model's parity slice (each input alone and in
  passes of 8 and 32 random neighbours of mixed lengths): max |Δ output| and changed answers per 1,000;
- accuracy: the task's official metric on the first N examples of the model's dev file (the export metric
  gate's code), PyTorch once as the reference;
- speed: median ms per pass of one dev input alone and of 32 real dev inputs padded together, all graphs
  timed in alternating rounds in this process, as ratios to fp32.
Usage, from the repository root:

    .venv/bin/python -m bench.int8_invariance runs/defaults/topics runs/defaults/similarity --threads 1 \\
        --out bench/results/int8_invariance-defaults.json
    .venv/bin/python -m bench.int8_invariance --markdown bench/results/int8_invariance-defaults.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import machine_facts

RECIPES = ("dynamic-keep-early-ffn-emb8", "rowwise-keep-early-ffn-emb8", "rowwise-keep-head-emb8",
           "static-keep-early-ffn-emb8")
METRIC_EXAMPLES = {"classification": 750, "pair": 125, "ner": 300, "qa": 150}
PARITY_EXAMPLES = {"classification": 96, "pair": 96, "ner": 64, "qa": 32}


def measure_model(folder: Path, recipes: tuple[str, ...], threads: int, rounds: int,
                  metric_examples: int | None = None, parity_examples: int | None = None) -> dict[str, Any]:
    import torch

    from export import calibration, invariance, parity
    from export.bundle_builder import finetune_files
    from export.onnx_export import export_onnx, load_finetuned
    from export.precision import RECIPES as ALL
    from export.precision import to_int8
    from tasks.registry import definition
    from tasks.runtime.inference import Batch, run_batch
    from tasks.runtime.onnx_session import create_session, onnx_item_runner, onnx_runner
    from tasks.runtime.tokenizer import load_tokenizer
    from training.bert.torch_runner import torch_item_runner

    torch.set_num_threads(threads)
    model, spec, _ = load_finetuned(folder)
    tokenizer = load_tokenizer(folder)
    files = finetune_files(folder)
    task = definition(spec.task)
    examples, source = parity.parity_slice(spec, tokenizer, parity.default_data_dir(),
                                           parity_examples or PARITY_EXAMPLES[spec.task])
    adapter = calibration.adapter(spec, tokenizer, files["dev_file"])
    dev = adapter.read(files["dev_file"], limit=metric_examples or METRIC_EXAMPLES[spec.task], seed=None)
    reference, _ = adapter.evaluate(torch_item_runner(model), dev, spec)
    metric_name, scale = task.headline_metric(reference)
    record: dict[str, Any] = {"model": folder.name, "task": spec.task, "metric": metric_name,
                              "metric_examples": len(dev), "dev_file": str(files["dev_file"]),
                              "pytorch_metric": reference[metric_name] * scale, "parity_slice": source,
                              "recipes": {}}
    with tempfile.TemporaryDirectory(prefix="berth-inv-") as scratch:
        graphs = {"fp32": export_onnx(model, spec.task, Path(scratch) / "fp32.onnx")}
        for recipe in recipes:
            feeds = None
            if ALL[recipe].static:
                items = calibration.model_inputs(spec, tokenizer, files["train_file"], calibration.DEFAULT_EXAMPLES)
                feeds = calibration.batches(items)
            graphs[recipe] = to_int8(graphs["fp32"], Path(scratch) / f"{recipe}.onnx", recipe, feeds)
        sessions = {name: create_session(path, "fp32" if name == "fp32" else "int8", threads)[0]
                    for name, path in graphs.items()}
        for name, session in sessions.items():
            started = time.perf_counter()
            gate = invariance.batch_invariance(spec, examples, onnx_runner(session, task.output_names))
            metrics, _ = adapter.evaluate(onnx_item_runner(session), dev, spec)
            value = metrics[metric_name] * scale
            record["recipes"][name] = {
                "batch_max_abs_diff": gate["max_abs_diff"], "changed_answers": gate["changed_answers"],
                "changed_answers_per_1000": gate["changed_answers_per_1000"], "invariance_examples": gate["examples"],
                "metric": value, "delta_vs_pytorch": value - record["pytorch_metric"],
                "describe": ALL[name].describe() if name != "fp32" else {"mode": "fp32"},
                "seconds": round(time.perf_counter() - started, 1)}
            print(f"{folder.name} {name:30s} batch max|Δ| {gate['max_abs_diff']:.3g}, changed "
                  f"{gate['changed_answers']}/{gate['examples']}, {metric_name} {value:.2f} "
                  f"({value - record['pytorch_metric']:+.2f})", flush=True)
        # Speed: one input alone and 32 real inputs in one pass, every graph in alternating rounds.
        items = [feature for example in examples for feature in example.features]
        by_length = sorted(range(len(items)), key=lambda i: len(items[i]))
        shapes = {"1 alone": [by_length[len(items) // 2]], "32 together": by_length[-32:] if len(items) >= 32
                  else by_length}
        runners = {name: onnx_runner(session, task.output_names) for name, session in sessions.items()}
        times: dict[str, dict[str, list[float]]] = {shape: {name: [] for name in runners} for shape in shapes}
        for shape, members in shapes.items():
            batch = Batch(tuple(members), -(-max(len(items[i]) for i in members) // 8) * 8)
            for runner in runners.values():
                run_batch(runner, items, batch, False)
            for _ in range(rounds):
                for name, runner in runners.items():
                    started = time.perf_counter()
                    run_batch(runner, items, batch, False)
                    times[shape][name].append(time.perf_counter() - started)
        speed = {}
        for shape, by_name in times.items():
            medians = {name: float(np.median(values)) for name, values in by_name.items()}
            speed[shape] = {name: {"ms": 1000 * m, "x_fp32": medians["fp32"] / m,
                                   "x_current_int8": medians.get(recipes[0], m) / m} for name, m in medians.items()}
        record["speed"] = speed
        record["speed_shapes"] = {shape: {"inputs": len(members), "tokens": [len(items[i]) for i in members]}
                                  for shape, members in shapes.items()}
    return record


def markdown(paths: list[Path]) -> str:
    records = [json.loads(path.read_text(encoding="utf-8")) for path in paths]
    lines = []
    for path, data in zip(paths, records):
        machine = data["machine"]
        flags = [f for f in machine.get("cpu_flags", []) if "avx512" in f or f in ("avx2", "amx_int8")]
        lines.append(f"- `{path.name}`: {machine.get('cpu_model')}, {data['threads']} thread(s), load average "
                     f"{machine.get('load_average', ['?'])[0]:.1f} at the start, flags {', '.join(flags)}; "
                     f"`{data['command']}`")
    lines += ["",
             "| model | graph | max \\|Δ\\| alone vs batched | changed answers / 1,000 | metric (dev examples) | "
             "PyTorch | graph | Δ points | ms 1 alone (× fp32, × current int8) | ms 32 together (× fp32, × current) |",
             "|---|---|---:|---:|---|---:|---:|---:|---|---|"]
    for model in (model for data in records for model in data["models"]):
        for name, figures in model["recipes"].items():
            speed = [model["speed"][shape][name] for shape in ("1 alone", "32 together")]
            lines.append(
                f"| {model['model']} | {name} | {figures['batch_max_abs_diff']:.2g} | "
                f"{figures['changed_answers_per_1000']:g} | {model['metric']} ({model['metric_examples']}) | "
                f"{model['pytorch_metric']:.2f} | {figures['metric']:.2f} | {figures['delta_vs_pytorch']:+.2f} | "
                + " | ".join(f"{s['ms']:.1f} ({s['x_fp32']:.2f}×, {s['x_current_int8']:.2f}×)" for s in speed) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="*", help="fine-tuned model folders")
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), help="the first is 'current int8'")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--metric-examples", type=int, help="dev examples scored (default by task)")
    parser.add_argument("--parity-examples", type=int, help="inputs of the invariance measure (default by task)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/int8_invariance.json"))
    parser.add_argument("--markdown", type=Path, nargs="+", help="print the docs table of these records and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(args.markdown))
        return 0
    models = [measure_model(folder, tuple(args.recipes), args.threads, args.rounds, args.metric_examples,
                            args.parity_examples) for folder in args.folders]
    record = {"machine": machine_facts(args.threads), "threads": args.threads, "rounds": args.rounds,
              "command": "python -m bench.int8_invariance " + " ".join(map(str, argv if argv is not None
                                                                            else sys.argv[1:])),
              "models": models}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1), encoding="utf-8")
    print(markdown([args.out]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
