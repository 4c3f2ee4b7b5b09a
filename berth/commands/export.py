"""`berth export`: a fine-tuned model folder -> an ONNX bundle the service can serve (see tasks/runtime/bundle.py)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from berth.config_files import add_config_flag, settings_from_args
from berth.flags import add_settings_flags
from export.precision import RECIPES
from export.settings import ExportSettings, missing_input, out_refusal


def check_device(settings: ExportSettings) -> None:
    """Refuse the device and precision pairings that cannot work, with the reason (export_bundle prefers CUDA unless
    `device` is cpu)."""
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
            "fp16 bundles are meant for CUDA; on the CPU provider fp16 runs slower than fp32 "
            "(validating on CPU anyway)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args, ExportSettings, "export")
    print(f"berth export settings: {settings.model_dump_json()}", file=sys.stderr)
    check_device(settings)
    refused = out_refusal(settings.out, settings.force) or missing_input(settings)
    if refused:
        from training.errors import UserFacingError

        raise UserFacingError(refused)

    from export.bundle_builder import EXPORT_FAILURES, export_bundle, quiet_optimizer_logs
    from export.invariance import InvarianceError
    from export.parity import ParityError

    quiet_optimizer_logs()

    examples = None
    if settings.examples:
        try:
            examples = json.loads(settings.examples.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise SystemExit(f"berth export: --examples {settings.examples}: {error}") from None
    try:
        bundle = export_bundle(settings, examples)
    except InvarianceError as error:
        print(f"berth export: refused, an input's outputs depend on its batch neighbours:\n{error}\n(an int8 recipe "
              "with per-row activation scales is batch-invariant; --allow-batch-dependent ships it marked)",
              file=sys.stderr)
        return 1
    except ParityError as error:
        print(f"berth export: refused, the ONNX model does not match PyTorch:\n{error}", file=sys.stderr)
        return 1
    except EXPORT_FAILURES as error:
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
        "parity": {k: bundle.parity.get(k) for k in ("passed", "max_abs_diff", "agreement", "confident_agreement",
                                                     "confident_examples", "examples", "threshold", "metric")},
        "int8": bundle.optimization.get("int8"),
        "batch_invariance": {k: bundle.batch_invariance.get(k) for k in ("max_abs_diff", "changed_answers",
                                                                          "examples", "batch_dependent")},
        "model_bytes": bundle.files["model.onnx"].bytes,
    }
    print(json.dumps(summary, indent=2))
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "export",
        help="export a fine-tuned model to an ONNX bundle (parity-checked)",
        description="Export a fine-tuned model folder (a Hugging Face BERT checkpoint with berth_task.json) to a "
        "bundle folder: model.onnx, tokenizer.json and bundle.json (task, labels, settings, precision, hashes, "
        "parity figures). The ONNX model is checked against PyTorch on a real dev slice of its task "
        "(SST-2, MRPC, CoNLL-2003, SQuAD from --data-dir) and the export is refused if they disagree: "
        "max |Δ logit| <= 1e-4 for fp32; for fp16 and int8, the same task answers on >= 99% of the examples "
        "where PyTorch is confident, and a task metric on the model's dev set at most 0.5 point below PyTorch's.",
    )
    add_settings_flags(
        p, ExportSettings,
        groups={"what to export": ["model_folder", "out", "task", "pooling", "examples", "force"],
                "precision and graph": ["precision", "int8_recipe", "calibration_data", "optimize", "device",
                                        "threads"],
                "parity and metric gates": ["data_dir", "parity_examples", "min_agreement", "dev_data",
                                            "metric_examples", "allow_batch_dependent"]},
        options={"model_folder": {"positional": True},
                 "int8_recipe": {"choices": sorted(RECIPES), "metavar": "RECIPE",
                                 "help": ExportSettings.model_fields["int8_recipe"].description + "; one of: "
                                 + ", ".join(sorted(RECIPES))}},
    )
    p.add_argument("--quiet", action="store_true", help="log warnings only")
    add_config_flag(p)
    p.set_defaults(func=run)
    return p
