"""`berth export`: a fine-tuned folder -> an ONNX bundle the service can serve (see tasks/bundle.py)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

# The ORT transformer optimizer logs every fusion at INFO; its summary is in the manifest instead.
NOISY_LOGGERS = ("fusion_base", "onnx_model", "onnx_model_bert", "fusion_utils")


class ExportSettings(BaseModel):
    checkpoint: Path = Field(description="fine-tuned folder: HF checkpoint + berth_task.json")
    out: Path = Field(description="bundle folder to write; its name is the model name")
    precision: Literal["fp32", "fp16", "int8"] = "fp32"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    task: str | None = None
    pooling: Literal["mean", "cls", "max"] | None = None
    optimize: Literal["auto", "always", "never"] = "auto"
    data_dir: Path | None = None
    parity_examples: int | None = None
    min_agreement: float = 0.99
    threads: int | None = None
    examples: Path | None = None
    force: bool = False


def check_device(settings: ExportSettings) -> bool:
    """Whether to prefer CUDA; refuses the pairings that cannot work, with the reason."""
    import onnxruntime

    if settings.device == "cuda":
        if settings.precision == "int8":
            raise SystemExit("berth export: int8 (dynamic quantization) does not run on the CUDA provider; "
                             "use --precision fp16 for CUDA, or --device cpu for int8")
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            raise SystemExit("berth export: --device cuda, but this onnxruntime has no CUDAExecutionProvider "
                             "(install onnxruntime-gpu instead of onnxruntime)")
    if settings.precision == "fp16" and settings.device == "cpu":
        logging.getLogger("berth.export").warning(
            "fp16 bundles are meant for CUDA; on the CPU provider fp16 runs slower than fp32 (validating on CPU anyway)")
    return settings.device != "cpu"


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    settings = ExportSettings(**{k: v for k, v in vars(args).items() if k in ExportSettings.model_fields})
    print(f"berth export settings: {settings.model_dump_json()}", file=sys.stderr)
    prefer_gpu = check_device(settings)
    if (settings.out / "bundle.json").exists() and not settings.force:
        raise SystemExit(f"berth export: {settings.out} already holds a bundle; use --force to replace it")

    from export.bundle_builder import export_bundle
    from export.onnx_export import ExportError
    from export.parity import ParityError
    from tasks.bundle import BundleError

    examples = None
    if settings.examples:
        try:
            examples = json.loads(settings.examples.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise SystemExit(f"berth export: --examples {settings.examples}: {error}") from None
    try:
        bundle = export_bundle(
            settings.checkpoint, settings.out, settings.precision, task=settings.task, example_inputs=examples,
            optimize_graph=settings.optimize, data_dir=settings.data_dir, parity_examples=settings.parity_examples,
            min_agreement=settings.min_agreement, threads=settings.threads, prefer_gpu=prefer_gpu,
            pooling=settings.pooling,
        )
    except ParityError as error:
        print(f"berth export: refused, the ONNX model does not match PyTorch:\n{error}", file=sys.stderr)
        return 1
    except (ExportError, FileNotFoundError, BundleError) as error:
        print(f"berth export: {error}", file=sys.stderr)
        return 2
    summary = {
        "bundle": str(bundle.path),
        "task": bundle.task,
        "precision": bundle.precision,
        "providers_validated": bundle.providers_validated,
        "fusions": bundle.optimization.get("fusions"),
        "offline_optimizer": bundle.optimization.get("offline_optimizer"),
        "chosen_because": bundle.optimization.get("chosen_because"),
        "parity": {k: bundle.parity[k] for k in ("passed", "max_abs_diff", "agreement", "examples", "threshold")},
        "model_bytes": bundle.files["model.onnx"].bytes,
    }
    print(json.dumps(summary, indent=2))
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "export",
        help="export a fine-tuned model to an ONNX bundle (parity-checked)",
        description="Export a fine-tuned folder (a Hugging Face BERT checkpoint with berth_task.json) to a bundle "
        "folder: model.onnx, tokenizer.json and bundle.json (task, labels, settings, precision, hashes, "
        "parity figures). The ONNX model is checked against PyTorch on a real dev slice of its task "
        "(SST-2, MRPC, CoNLL-2003, SQuAD from --data-dir) and the export is refused if they disagree: "
        "max |Δ logit| <= 1e-4 for fp32, the same task answers on >= 99% of examples for fp16 and int8.",
    )
    p.add_argument("checkpoint", type=Path, help="fine-tuned model folder")
    p.add_argument("--out", type=Path, required=True, help="bundle folder to write (its name is the model name)")
    p.add_argument("--precision", choices=["fp32", "fp16", "int8"], default="fp32",
                   help="fp32: any provider; fp16: for CUDA (fp32 inputs/outputs); int8: dynamic quantization, "
                   "CPU only (default: %(default)s)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where to validate: auto uses CUDA when onnxruntime has it, else the CPU (default: %(default)s)")
    p.add_argument("--task", choices=["classification", "pair", "ner", "qa", "fill-mask", "embedding", "multiple-choice"],
                   help="the task, for a folder without berth_task.json (e.g. fill-mask on a pretrained MLM "
                   "checkpoint, embedding on any BERT or sentence-transformers folder)")
    p.add_argument("--pooling", choices=["mean", "cls", "max"],
                   help="embedding: sentence pooling (default: the folder's sentence-transformers 1_Pooling config, "
                   "else mean)")
    p.add_argument("--optimize", choices=["auto", "always", "never"], default="auto",
                   help="ONNX Runtime's offline BERT fusions: auto keeps whichever fp32 graph runs faster here "
                   "(default: %(default)s)")
    p.add_argument("--data-dir", type=Path,
                   help="the shared data sets for the parity slice (default: ../shared/data or $BERTH_SHARED_DATA; "
                   "else the shipped samples)")
    p.add_argument("--parity-examples", type=int,
                   help="dev examples checked (default by task: 256 classification/pair, 128 ner/fill-mask, 100 qa)")
    p.add_argument("--min-agreement", type=float, default=0.99,
                   help="fp16/int8: share of examples whose task answer must match PyTorch; recorded in the "
                   "manifest (default: %(default)s)")
    p.add_argument("--threads", type=int, help="CPU threads for PyTorch and ONNX Runtime (default: all cores)")
    p.add_argument("--examples", type=Path, help="JSON file: a list of example `inputs` of the task's route, "
                   "written into the manifest (shown in GET /v1/models and offered by the playground)")
    p.add_argument("--force", action="store_true", help="replace an existing bundle at --out")
    p.add_argument("--quiet", action="store_true", help="log warnings only")
    p.set_defaults(func=run)
    return p
