"""The accuracy cost of int8: a fine-tuned model's dev metrics in PyTorch, ONNX fp32 and ONNX int8.

All three run through the same evaluation code as `berth evaluate` (training/finetuning/task_data.py: the task
layer's encoding and decoding, the official metrics), PyTorch and ONNX Runtime each as the task layer's
runner. The int8 graph is made as `berth export --precision int8` makes it (export/precision.py
DEFAULT_RECIPE; `--recipe` for another, static ones calibrated on the model's own training file from
its finetune_run.json or `--train`). Speed: the fp32 and int8 sessions side by side at batch 1 and
batch 8 of the task's typical length. Usage, from the repository root:

    .venv/bin/python -m bench.int8_accuracy runs/sst2 --data ../shared/data/sst2/dev.tsv
    .venv/bin/python -m bench.int8_accuracy runs/squad --data ../shared/data/squad/v1.1/dev-v1.1.json --limit 1000
    .venv/bin/python -m bench.int8_accuracy --markdown     # the docs/ENGINE.md table from bench/results
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.machine import machine_facts
from tasks.definition import TaskDefinition
from tasks.registry import definition

RESULTS = Path(__file__).resolve().parent / "results"
HEADLINE = ("accuracy", "f1", "exact", "precision", "recall", "pearson", "spearman")


def onnx_engine(model_path: Path, precision: str, threads: int):
    """`model_path` in ONNX Runtime as the task definitions' runner (what evaluation runs), and its provider."""
    from tasks.runtime.onnx_session import create_session, onnx_item_runner

    session, provider = create_session(model_path, precision, intra_op_threads=threads)
    return onnx_item_runner(session), provider


def speed_pair(fp32_path: Path, int8_path: Path, length: int, vocab_size: int, threads: int,
               rounds: int = 5) -> dict[str, Any]:
    """Median seconds per batch of fp32 and int8, alternating, at batch 1 and 8 x `length` tokens."""
    import numpy as np

    from export.optimize import synthetic_batch
    from tasks.runtime.onnx_session import create_session

    sessions = {name: create_session(path, name, threads)[0]
                for name, path in (("fp32", fp32_path), ("int8", int8_path))}
    figures: dict[str, Any] = {}
    for batch in (1, 8):
        feeds = synthetic_batch(batch, length, vocab_size)
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for session in sessions.values():
            session.run(None, feeds)
        for _ in range(rounds):
            for name, session in sessions.items():
                started = time.perf_counter()
                session.run(None, feeds)
                times[name].append(time.perf_counter() - started)
        medians = {name: float(np.median(values)) for name, values in times.items()}
        figures[f"{batch}x{length}"] = {"fp32_ms": 1000 * medians["fp32"], "int8_ms": 1000 * medians["int8"],
                                        "int8_speedup": medians["fp32"] / medians["int8"]}
    return figures


TYPICAL_LENGTH = {"classification": 32, "pair": 64, "ner": 48, "qa": 192}


def evaluate_all(folder: Path, data: Path, limit: int | None, threads: int, recipe: str | None,
                 train: Path | None) -> dict[str, Any]:
    import torch

    from export import calibration
    from export.bundle_builder import finetune_files
    from export.onnx_export import export_onnx, load_finetuned
    from export.precision import DEFAULT_RECIPE, RECIPES, to_int8
    from tasks.runtime.tokenizer import load_tokenizer
    from training.bert.torch_runner import torch_item_runner

    torch.set_num_threads(threads)
    model, spec, _ = load_finetuned(folder)
    if type(definition(spec.task)).score is TaskDefinition.score:  # a task without a dev metric (fill-mask)
        raise SystemExit(f"int8_accuracy scores fine-tuned heads with a dev metric; {spec.task} has none")
    tokenizer = load_tokenizer(folder)
    adapter = calibration.adapter(spec, tokenizer, data)
    examples = adapter.read(data, limit=limit, seed=0)
    train = train or finetune_files(folder).get("train_file")
    recipe = recipe or DEFAULT_RECIPE
    feeds = None
    if RECIPES[recipe].static:
        feeds = calibration.batches(calibration.model_inputs(spec, tokenizer, train, calibration.DEFAULT_EXAMPLES))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="berth-int8-") as scratch:
        fp32_path = export_onnx(model, spec.task, Path(scratch) / "fp32.onnx")
        int8_path = to_int8(fp32_path, Path(scratch) / "int8.onnx", recipe, feeds)
        speed = speed_pair(fp32_path, int8_path, min(TYPICAL_LENGTH[spec.task], spec.max_seq_length),
                           model.config.vocab_size, threads)
        engines = {"pytorch": (torch_item_runner(model), "cpu")}
        for name, path, precision in (("onnx-fp32", fp32_path, "fp32"), ("onnx-int8", int8_path, "int8")):
            engines[name] = onnx_engine(path, precision, threads)
        for name, (engine, provider) in engines.items():
            started = time.perf_counter()
            metrics, _ = adapter.evaluate(engine, examples, spec)
            elapsed = time.perf_counter() - started
            results[name] = {"metrics": metrics, "seconds": round(elapsed, 1), "provider": provider}
            shown = {k: round(v, 4) for k, v in metrics.items() if k in HEADLINE}
            print(f"{name:10s} {shown} ({elapsed:.0f} s)", flush=True)
    reference = results["pytorch"]["metrics"]
    for name in ("onnx-fp32", "onnx-int8"):
        metrics = results[name]["metrics"]
        results[name]["delta_vs_pytorch"] = {k: metrics[k] - reference[k]
                                             for k in HEADLINE if k in metrics and k in reference}
    return {"task": spec.task, "examples": len(examples), "results": results, "speed": speed,
            "int8_recipe": {"name": recipe, **RECIPES[recipe].describe(),
                            "calibration_file": str(train) if feeds else None}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="?", help="fine-tuned folder (checkpoint + berth_task.json)")
    parser.add_argument("--data", type=Path, help="dev file of the task (SST-2 dev.tsv, SQuAD dev json, ...)")
    parser.add_argument("--limit", type=int, help="evaluate on a seeded sample of this many examples")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recipe", help="int8 recipe (export/precision.py RECIPES; default: what berth export uses)")
    parser.add_argument("--train", type=Path, help="calibration file (default: the folder's training file)")
    parser.add_argument("--out", type=Path,
                        help="JSON output (default: bench/results/int8_accuracy-<folder name>.json)")
    parser.add_argument("--markdown", action="store_true", help="print the docs table from bench/results and exit")
    parser.add_argument("--speed", nargs=2, type=Path, metavar=("FP32_BUNDLE", "INT8_BUNDLE"),
                        help="only time two bundles side by side (alternating rounds) and exit")
    parser.add_argument("--rounds", type=int, default=15, help="--speed: alternating rounds per shape")
    args = parser.parse_args(argv)
    if args.speed:
        return speed_only(args.speed[0], args.speed[1], args.threads, args.rounds)
    if args.markdown:
        print(markdown(sorted(RESULTS.glob("int8_accuracy-*.json"))))
        return 0
    if args.folder is None or args.data is None:
        parser.error("folder and --data are needed (or --markdown)")
    report = evaluate_all(args.folder, args.data, args.limit, args.threads, args.recipe, args.train)
    int8 = report["results"]["onnx-int8"]["delta_vs_pytorch"]
    print("int8 - pytorch: " + ", ".join(f"{k} {v:+.4f}" for k, v in int8.items()))
    report.update({"model": str(args.folder.resolve()), "data": str(args.data), "limit": args.limit,
                   "quantized_graph": "plain",
                   "machine": machine_facts(threads=args.threads)})
    out = args.out or RESULTS / f"int8_accuracy-{args.folder.resolve().name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


def speed_only(fp32_bundle: Path, int8_bundle: Path, threads: int, rounds: int) -> int:
    from tasks.bundle_checks import load_bundle

    fp32, int8 = load_bundle(fp32_bundle), load_bundle(int8_bundle)
    vocab = int(fp32.encoder_config.get("vocab_size", 30522))
    figures = {length: speed_pair(fp32.model_path, int8.model_path, length, vocab, threads, rounds)
               for length in (32, 128)}
    for by_batch in figures.values():
        for shape, f in by_batch.items():
            print(f"{shape}: fp32 {f['fp32_ms']:.1f} ms, int8 {f['int8_ms']:.1f} ms, int8 {f['int8_speedup']:.2f}x")
    out = RESULTS / f"int8_speed-{int8_bundle.resolve().name}.json"
    out.write_text(json.dumps({"fp32_bundle": str(fp32_bundle), "int8_bundle": str(int8_bundle),
                               "int8_recipe": int8.optimization.get("int8"), "threads": threads, "rounds": rounds,
                               "figures": figures, "machine": machine_facts(threads=threads)}, indent=2) + "\n",
                   encoding="utf-8")
    print(f"wrote {out}")
    return 0


def markdown(paths: list[Path]) -> str:
    """The docs/ENGINE.md table: per model, PyTorch / fp32 / int8 dev metric, the int8 cost, speed."""
    lines = ["| model | task | dev examples | metric | PyTorch | ONNX fp32 | ONNX int8 | int8 − fp32 (points) "
             "| int8 recipe | int8 speed-up batch 1 / batch 8 (tokens) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        record = json.loads(path.read_text(encoding="utf-8"))
        if "speed" not in record:
            continue  # a record of the earlier dynamic-only format
        results = record["results"]
        name, scale = definition(record["task"]).headline_metric(results["pytorch"]["metrics"])
        values = [results[e]["metrics"][name] * scale for e in ("pytorch", "onnx-fp32", "onnx-int8")]
        speed = list(record["speed"].values())
        length = next(iter(record["speed"])).split("x")[1]
        lines.append(f"| {Path(record['model']).name} | {record['task']} | {record['examples']} | {name} | "
                     f"{values[0]:.2f} | {values[1]:.2f} | {values[2]:.2f} | {values[2] - values[1]:+.2f} | "
                     f"{record['int8_recipe']['name']} | {speed[0]['int8_speedup']:.2f}× / "
                     f"{speed[1]['int8_speedup']:.2f}× ({length}) |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
