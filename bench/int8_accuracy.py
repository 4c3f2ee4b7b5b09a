"""The accuracy cost of int8: a fine-tuned model's dev metrics in PyTorch, ONNX fp32 and ONNX int8.

All three run through the same evaluation code as `berth evaluate` (training/task_data.py: the task
layer's encoding and decoding, the official metrics), the ONNX models wrapped as a torch module that
calls ONNX Runtime. The int8 graph is made as `berth export --precision int8` makes it (dynamic
quantization, per-channel int8 weights, reduce_range). Usage, from the repository root:

    .venv/bin/python -m bench.int8_accuracy runs/sst2 --data ../shared/data/sst2/dev.tsv
    .venv/bin/python -m bench.int8_accuracy runs/squad --data ../shared/data/squad/v1.1/dev-v1.1.json --limit 2000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.machine import machine_facts

RESULTS = Path(__file__).resolve().parent / "results"
HEADLINE = ("accuracy", "f1", "exact", "precision", "recall", "pearson", "spearman")


def onnx_module(model_path: Path, output_names: tuple[str, ...], precision: str, threads: int):
    """A torch.nn.Module whose forward runs `model_path` in ONNX Runtime (so PyTorch evaluation code runs it)."""
    import torch

    from tasks.onnx_session import create_session

    session, provider = create_session(model_path, precision, intra_op_threads=threads)

    class OnnxModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)  # tells evaluation the device

        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            feeds = {"input_ids": input_ids.cpu().numpy(), "attention_mask": attention_mask.cpu().numpy(),
                     "token_type_ids": token_type_ids.cpu().numpy()}
            outputs = session.run(list(output_names), feeds)
            return {name: torch.from_numpy(array) for name, array in zip(output_names, outputs)}

    return OnnxModel().eval(), provider


def evaluate_all(folder: Path, data: Path, limit: int | None, threads: int, optimized: bool) -> dict[str, Any]:
    import torch

    from export.onnx_export import export_onnx, load_finetuned
    from export.optimize import optimize_bert
    from export.precision import to_int8
    from tasks.tokenizer import load_tokenizer
    from training import task_data
    from training.finetune import FinetuneSettings

    torch.set_num_threads(threads)
    model, spec, _ = load_finetuned(folder)
    if spec.task == "fill-mask":
        raise SystemExit("int8_accuracy scores fine-tuned task heads (classification, pair, ner, qa)")
    settings = FinetuneSettings(task=spec.task, train_file=data, out=folder,
                                regression=spec.problem_type == "regression", max_seq_length=spec.max_seq_length,
                                doc_stride=spec.doc_stride, max_query_length=spec.max_query_length)
    adapter = task_data.adapter_for(settings, load_tokenizer(folder))
    examples = adapter.read(data, limit=limit, seed=0)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="berth-int8-") as scratch:
        fp32_path = export_onnx(model, spec.task, Path(scratch) / "fp32.onnx")
        if optimized:
            fused = Path(scratch) / "optimized.onnx"
            optimize_bert(fp32_path, fused, model.config.num_attention_heads, model.config.hidden_size)
            fp32_path = fused
        int8_path = to_int8(fp32_path, Path(scratch) / "int8.onnx")
        engines = {"pytorch": (model, "cpu")}
        for name, path, precision in (("onnx-fp32", fp32_path, "fp32"), ("onnx-int8", int8_path, "int8")):
            engines[name] = onnx_module(path, spec.output_names, precision, threads)
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
        results[name]["delta_vs_pytorch"] = {k: metrics[k] - reference[k] for k in HEADLINE if k in metrics and k in reference}
    return {"task": spec.task, "examples": len(examples), "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="fine-tuned folder (checkpoint + berth_task.json)")
    parser.add_argument("--data", type=Path, required=True, help="dev file of the task (SST-2 dev.tsv, SQuAD dev json, ...)")
    parser.add_argument("--limit", type=int, help="evaluate on a seeded sample of this many examples")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--optimized", action="store_true", help="quantize the offline-optimized graph instead of the plain one")
    parser.add_argument("--out", type=Path, help="JSON output (default: bench/results/int8_accuracy-<folder name>.json)")
    args = parser.parse_args(argv)
    report = evaluate_all(args.folder, args.data, args.limit, args.threads, args.optimized)
    int8 = report["results"]["onnx-int8"]["delta_vs_pytorch"]
    print("int8 - pytorch: " + ", ".join(f"{k} {v:+.4f}" for k, v in int8.items()))
    report.update({"model": str(args.folder.resolve()), "data": str(args.data), "limit": args.limit,
                   "quantized_graph": "optimized" if args.optimized else "plain",
                   "machine": machine_facts(threads=args.threads)})
    out = args.out or RESULTS / f"int8_accuracy-{args.folder.resolve().name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
