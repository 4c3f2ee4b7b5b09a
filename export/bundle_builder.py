"""Fine-tuned folder -> bundle: export, optimize, convert precision, pass the parity gate, write the manifest.

The bundle is built in a scratch folder beside `out` and moved into place only when every step
passed, so a failed export never leaves a half bundle where the service would look.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

import onnxruntime

from export import calibration, invariance, onnx_export, optimize, parity
from export.bundle_writing import load_private_key, sign_bundle, write_manifest
from export.precision import DEFAULT_RECIPE, RECIPES, to_fp16, to_int8
from export.settings import ExportSettings, out_refusal
from tasks.bundle_checks import check_examples, load_bundle
from tasks.model_card import CARD_FILE, bundle_card, checkpoint_reference, portable_paths
from tasks.registry import definition, head_class
from tasks.runtime.bundle import (
    FORMAT_VERSION,
    MODEL_FILE,
    PRECISION_PROVIDERS,
    TOKENIZER_FILE,
    Bundle,
    BundleError,
    file_sha256,
)
from tasks.runtime.onnx_session import CPU, CUDA, create_session, onnx_item_runner, onnx_runner
from tasks.runtime.progress import Progress, counted
from tasks.runtime.tokenizer import load_tokenizer
from training.errors import UserFacingError
from training.finetuning.evaluate import recorded_columns
from training.loop.saving import disk_errors, ensure_free_space, replace_directory, tensor_bytes

log = logging.getLogger(__name__)

# What stops an export: a gate's refusal (`berth export` exits 1), or a folder or graph it cannot export (2).
EXPORT_REFUSALS = (invariance.InvarianceError, parity.ParityError)
EXPORT_FAILURES = (onnx_export.ExportError, FileNotFoundError, BundleError)
# The ORT transformer optimizer logs every fusion at INFO; its summary is in the manifest instead.
NOISY_LOGGERS = ("fusion_base", "onnx_model", "onnx_model_bert", "fusion_utils")


def quiet_optimizer_logs() -> None:
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)

Optimize = Literal["auto", "always", "never"]


def export_bundle(settings: ExportSettings, example_inputs: list[Any] | None = None, *,
                  signing_key: str | Path | None = None) -> Bundle:
    """Export the fine-tuned `settings.model_folder` as a bundle in `settings.out` (replaced if it exists), with the
    settings of `berth export` (export/settings.py), passed whole.

    - `precision`: fp32 (any provider), fp16 (for CUDA; keeps fp32 inputs/outputs), int8 (dynamic
      quantization; CPU only).
    - `optimize`: `auto` runs ORT's offline BERT optimizer and keeps whichever graph (plain or
      fused, in the target precision) runs faster here (measured); `always` / `never` force the choice.
    - `example_inputs`: example `inputs` of the task's route (`berth export` reads them from `settings.examples`),
      written into the manifest's `examples` (the playground offers them); checked before anything is exported.
    - `data_dir`: the shared data sets for the parity slice (default ../shared/data if present,
      else the shipped samples, else built-in sentences); `parity_examples` examples are checked
      (default: the task definition's `parity_examples`),
      and fp16/int8 must give the same task answer on `min_agreement` of them (the threshold used
      is written into the manifest).
    - `pooling`: for `embedding`, overrides the pooling read from the folder's sentence-transformers files.
    - fp16/int8 also pass the task-metric gate on `dev_data` (default: the dev file the checkpoint was
      fine-tuned with, from its finetune_run.json), `metric_examples` of it (default by task).
    - `int8_recipe` (one of `export.precision.RECIPES`, default `DEFAULT_RECIPE`); static recipes are
      calibrated on `calibration_data` (default: the checkpoint's training file).
    - `signing_key`: an Ed25519 private key (PEM, as `berth sign-bundle --new-key` writes) to sign the
      bundle with (`export.bundle_writing.sign_bundle`); read before the export starts, so a bad key fails at once.
    - The batch-invariance gate (`export.invariance`): each parity input alone and among random neighbours, on
      the CPU session; figures in the manifest's `batch_invariance`. Over its bound the export fails with
      `invariance.InvarianceError`, unless `allow_batch_dependent`: the bundle is then marked
      `batch_invariance.batch_dependent: true` (shown by GET /v1/models).
    Raises `parity.ParityError` when the ONNX model disagrees with PyTorch beyond the threshold.
    """
    import torch

    from training.bert.torch_runner import torch_runner

    checkpoint, out, precision, threads = settings.model_folder, settings.out, settings.precision, settings.threads
    refused = out_refusal(out, force=True)  # whether a bundle there may be replaced is the caller's (--force)
    if refused:  # a file or someone's folder: never replaced, whoever calls (a sweep's --export, build-defaults)
        raise UserFacingError(refused)
    prefer_gpu, opset = settings.device != "cpu", onnx_export.OPSET
    private_key = load_private_key(signing_key) if signing_key is not None else None
    if threads:
        torch.set_num_threads(threads)
    model, spec, load_report = onnx_export.load_finetuned(checkpoint, settings.task, settings.pooling)
    if load_report.fresh or load_report.resized:
        log.warning("%s: weights not in the checkpoint were initialized fresh (%s); "
                    "the bundle will not answer as a trained model", checkpoint, load_report)
    config = model.config
    check_examples(spec.task, example_inputs or [])
    data_dir = settings.data_dir or parity.default_data_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    trained_on = finetune_files(checkpoint)
    calibration_file = _existing(settings.calibration_data) or trained_on.get("train_file")
    dev_file = _existing(settings.dev_data) or trained_on.get("dev_file")
    columns = recorded_columns(checkpoint)  # a table dev file is read with the columns fine-tuning read
    convert = CONVERTERS[precision]
    if precision == "int8":
        recipe = settings.int8_recipe or DEFAULT_RECIPE
        feeds = None
        if RECIPES[recipe].static:
            if calibration_file is None:
                raise FileNotFoundError(f"int8 recipe {recipe!r} needs calibration data: pass the training file")
            items = calibration.model_inputs(spec, load_tokenizer(checkpoint), calibration_file,
                                             calibration.DEFAULT_EXAMPLES)
            feeds = calibration.batches(items)

        def convert(source: Path, target: Path) -> Path:
            return to_int8(source, target, recipe, feeds)

    kept = f"the bundle in {out} is unchanged" if out.exists() else "no bundle was written"
    # The scratch folder holds the plain ONNX export (about the fp32 weights) and the converted model at once.
    ensure_free_space(out.parent, 2 * tensor_bytes(model.state_dict()), "the bundle")
    with (disk_errors(out.parent, "the bundle", kept),
          tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as scratch_name):
        scratch = Path(scratch_name)
        plain = onnx_export.export_onnx(model, spec.task, scratch / "plain.onnx", opset)
        log.info("exported %s (%s) to ONNX opset %d", checkpoint, spec.task, opset)
        built, optimization = _build_model_file(
            plain, scratch, config, settings.optimize, precision, threads or 0, prefer_gpu, convert
        )
        if precision == "int8":
            optimization["int8"] = {"recipe": recipe, **RECIPES[recipe].describe(),
                                    "calibration": {"file": str(calibration_file),
                                                    "examples": calibration.DEFAULT_EXAMPLES}
                                    if RECIPES[recipe].static else None}
        final = scratch / "bundle"
        final.mkdir()
        model_path = final / MODEL_FILE
        shutil.move(str(built), str(model_path))
        _write_tokenizer(checkpoint, final / TOKENIZER_FILE)

        tokenizer = load_tokenizer(final / TOKENIZER_FILE)
        examples, source = parity.parity_slice(
            spec, tokenizer, data_dir, settings.parity_examples or definition(spec.task).parity_examples,
            dev_file=dev_file, columns=columns)
        _say_gate_data(dev_file, settings.dev_data, source, precision)
        output_names = definition(spec.task).output_names
        reference = torch_runner(model, output_names)
        reports = []
        invariant: dict[str, Any] | None = None
        for provider in _providers_to_validate(precision, prefer_gpu):
            session, used = create_session(model_path, precision, threads or 0, prefer_gpu=provider == CUDA)
            items = sum(len(e.features) for e in examples)
            with Progress(f"parity gate ({used})", total=items, unit="items") as bar:
                candidate = counted(onnx_runner(session, output_names), bar)
                report = parity.check_parity(spec, examples, reference, candidate,
                                             precision, used, source, min_agreement=settings.min_agreement,
                                             raise_on_failure=precision == "fp32",
                                             metric_checked=dev_file is not None)
            if precision != "fp32":
                report = _with_metric_gate(report, spec, tokenizer, dev_file, model, session,
                                           settings.metric_examples, checkpoint, columns)
            log.info("%s", parity.format_report(report))
            reports.append(report)
            if used == CPU:  # what a batching server or `berth predict` runs on the CPU
                invariant = _invariance_gate(spec, examples, onnx_runner(session, output_names), used,
                                             settings.allow_batch_dependent)
        parity_figures = {**reports[0], "providers": [r["provider"] for r in reports]}
        if len(reports) > 1:
            parity_figures["by_provider"] = reports

        inputs, outputs = onnx_export.graph_io(model_path)
        manifest = _manifest(spec, config, precision, opset, inputs, outputs, checkpoint, parity_figures,
                             optimization, validated=[r["provider"] for r in reports], out_name=out.name)
        if invariant is not None:
            manifest["batch_invariance"] = invariant
        if example_inputs:
            manifest["examples"] = example_inputs
        manifest = portable_paths(manifest, [data_dir, Path.cwd()])  # no path of this machine in the bundle
        write_manifest(final, manifest)
        (final / CARD_FILE).write_text(bundle_card(final, manifest, checkpoint), encoding="utf-8")
        if private_key is not None:
            sign_bundle(final, private_key)
        replace_directory(final, out)  # a kill leaves the old bundle or the new one, never half of one
    bundle = load_bundle(out)
    log.info("bundle %s: %s %s, parity %s", out, spec.task, precision,
             "passed" if bundle.parity["passed"] else "failed")
    return bundle


CONVERTERS = {"fp32": lambda source, target: Path(shutil.copyfile(source, target)), "fp16": to_fp16, "int8": to_int8}


def _say_gate_data(dev_file: Path | None, given: Path | None, source: str, precision: str) -> None:
    """One line on what the gates read: the model's own dev file, or (without one) the task's shipped data."""
    if dev_file is not None:
        whose = "given with --dev-data" if given is not None else "recorded in the folder's finetune_run.json"
        gates = "parity and task-metric gates read" if precision != "fp32" else "parity gate reads"
        log.info("the %s the model's own dev file %s (%s)", gates, dev_file, whose)
    else:
        log.warning("no dev file of this model (none recorded in finetune_run.json, no --dev-data): the parity gate "
                    "reads %s, the task's shipped data, not data this model was trained for; pass --dev-data FILE "
                    "to gate it on its own", source)


def _with_metric_gate(report: dict[str, Any], spec, tokenizer, dev_file: Path | None, model, session,
                      metric_examples: int | None, checkpoint: Path,
                      columns: dict[str, str] | None = None) -> dict[str, Any]:
    """Add the task-metric gate to an fp16/int8 agreement report; raise `ParityError` if either failed. The
    PyTorch reference is read from the checkpoint's own dev evaluation (training/finetuning/output_cache.py)
    where it holds these weights' outputs on these inputs, and computed otherwise."""
    if dev_file is not None:
        from training.bert.torch_runner import torch_item_runner
        from training.finetuning import output_cache

        reference = output_cache.Reusing(torch_item_runner(model, "metric gate: PyTorch"), model,
                                         checkpoint / output_cache.CACHE_FILE)
        metric = parity.metric_gate(spec, tokenizer, dev_file, reference,
                                    onnx_item_runner(session, progress="metric gate: ONNX"), metric_examples,
                                    columns=columns)
        metric["reference_outputs"] = "the checkpoint's dev evaluation" if reference.reused else "computed"
        report = {**report, "metric": metric, "passed": report["passed"] and metric["passed"],
                  "threshold": {**report["threshold"], "metric_drop_points": metric["max_drop_points"]}}
    else:
        report = {**report, "metric": None}
        log.warning("no dev file with gold answers (the checkpoint has no finetune_run.json and none was given): "
                    "the %s gate checked agreement only", report["precision"])
    if not report["passed"]:
        raise parity.ParityError(report)
    return report


def _invariance_gate(spec, examples, runner, provider: str, allow_batch_dependent: bool) -> dict[str, Any]:
    """The batch-invariance figures for the manifest; raise `InvarianceError` over the bound unless allowed."""
    report = {**invariance.batch_invariance(spec, examples, runner), "provider": provider}
    log.info("%s", invariance.format_invariance(report))
    if not report["passed"]:
        if not allow_batch_dependent:
            raise invariance.InvarianceError(report)
        log.warning("the bundle is marked batch-dependent, as asked: an input's answer moves with its batch "
                    "neighbours by up to %.3g", report["max_abs_diff"])
    return {**report, "batch_dependent": not report["passed"]}


def finetune_files(checkpoint: Path) -> dict[str, Path]:
    """The training and dev files a `berth finetune` folder was made with, where they still exist."""
    record = checkpoint / "finetune_run.json"
    if not record.is_file():
        return {}
    settings = json.loads(record.read_text(encoding="utf-8")).get("settings", {})
    found = {name: _existing(settings.get(name)) for name in ("train_file", "dev_file")}
    return {name: path for name, path in found.items() if path is not None}


def _existing(path: str | Path | None) -> Path | None:
    return Path(path) if path and Path(path).is_file() else None


def _build_model_file(
    plain: Path, scratch: Path, config: Any, mode: str, target_precision: str, threads: int, prefer_gpu: bool,
    convert: Any,
) -> tuple[Path, dict[str, Any]]:
    """The model file in the target precision, from the plain or the offline-optimized graph, and the
    manifest's "optimization" record saying which and why.

    `auto` converts both graphs to the target precision and keeps the faster, timed on the provider
    the bundle is for (the plain graph unless the fused one is clearly faster). fp16 is only timed
    where CUDA is present: fp16 speed on a CPU says nothing about CUDA.
    """
    if mode == "never" or target_precision == "int8":
        # int8 recipes keep named MatMuls of the plain graph in fp32, and the fused graph measured no
        # faster in int8 on the CPU (docs/ENGINE.md §2).
        because = "offline optimization not requested" if mode == "never" else \
            "int8 quantizes the plain graph (its recipes name the plain graph's MatMuls)"
        return convert(plain, scratch / f"plain-{target_precision}.onnx"), {
            "offline_optimizer": False, "fusions": {}, "chosen_because": because}
        return convert(plain, scratch / f"plain-{target_precision}.onnx"), {
            "offline_optimizer": False, "fusions": {}, "chosen_because": "offline optimization not requested"}
    fused = scratch / "optimized.onnx"
    fusions = optimize.optimize_bert(plain, fused, config.num_attention_heads, config.hidden_size)
    record: dict[str, Any] = {"fusions": fusions}
    if mode == "always":
        return convert(fused, scratch / f"optimized-{target_precision}.onnx"), {
            **record, "offline_optimizer": True, "chosen_because": "requested (--optimize always)"}
    if target_precision == "fp16" and not (prefer_gpu and CUDA in onnxruntime.get_available_providers()):
        # On CUDA the fused Attention / SkipLayerNorm kernels are what make fp16 fast (ORT's transformer
        # guide converts the optimized graph).
        return convert(fused, scratch / "optimized-fp16.onnx"), {
            **record, "offline_optimizer": True,
            "chosen_because": "fp16 targets CUDA, not present here to measure; converted the fused graph, "
                              "as ORT recommends"}
    candidates = {name: convert(path, scratch / f"{name}-{target_precision}.onnx")
                  for name, path in (("plain", plain), ("optimized", fused))}
    feeds = optimize.synthetic_batch(8, 128, config.vocab_size)
    winner, timing = optimize.fastest_graph(candidates, feeds, target_precision, threads, prefer_gpu)
    seconds = timing["seconds_per_batch"]
    ratio = seconds["plain"] / seconds["optimized"]
    because = (f"{target_precision} measured on {timing['provider']} at batch 8 x 128: "
               f"plain {seconds['plain'] * 1000:.1f} ms, optimized {seconds['optimized'] * 1000:.1f} ms per batch "
               f"(optimized is {ratio:.2f}x as fast); kept the {winner} graph"
               + ("" if winner == "optimized"
                  else " (ORT's session-level optimizations already fuse much of it at load)"))
    log.info("%s", because)
    return candidates[winner], {**record, "offline_optimizer": winner == "optimized", "chosen_because": because,
                                "timing": timing}


def _providers_to_validate(target_precision: str, prefer_gpu: bool) -> list[str]:
    """Where the gate runs: CUDA when present (not for int8), and the CPU (for fp16 only without CUDA)."""
    available = onnxruntime.get_available_providers()
    providers = [CUDA] if prefer_gpu and CUDA in available and target_precision != "int8" else []
    if target_precision != "fp16" or not providers:
        providers.append(CPU)
    return providers


def _write_tokenizer(checkpoint: Path, target: Path) -> None:
    if (checkpoint / TOKENIZER_FILE).is_file():
        shutil.copyfile(checkpoint / TOKENIZER_FILE, target)
    else:  # a folder with vocab.txt only: save the tokenizer berth builds from it
        load_tokenizer(checkpoint).save(str(target))


def _weights_file(checkpoint: Path) -> Path | None:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (checkpoint / name).is_file():
            return checkpoint / name
    return None


def _manifest(spec, config, target_precision, opset, inputs, outputs, checkpoint, parity_figures, optimization,
              validated, out_name) -> dict[str, Any]:
    weights = _weights_file(checkpoint)
    return {
        "format_version": FORMAT_VERSION,
        "name": out_name,
        "task": spec.task,
        "labels": spec.labels,
        "problem_type": spec.problem_type,
        "task_settings": {
            "max_seq_length": spec.max_seq_length,
            "doc_stride": spec.doc_stride,
            "max_query_length": spec.max_query_length,
            "version_2_with_negative": spec.version_2_with_negative,
            "null_score_diff_threshold": spec.null_score_diff_threshold,
            **spec.extra,
        },
        "precision": target_precision,
        "execution_providers": PRECISION_PROVIDERS[target_precision],
        "providers_validated": validated,
        "opset": opset,
        "inputs": inputs,
        "outputs": outputs,
        "source": {
            "checkpoint": checkpoint_reference(checkpoint),  # not a path of this machine
            "weights_sha256": file_sha256(weights) if weights else None,
            "dev_metrics": spec.dev_metrics,
        },
        "parity": parity_figures,
        "optimization": optimization,
        "model_config": {
            "hidden_size": config.hidden_size,
            "num_attention_heads": config.num_attention_heads,
            "num_hidden_layers": config.num_hidden_layers,
            "intermediate_size": config.intermediate_size,
            "max_position_embeddings": config.max_position_embeddings,
            "vocab_size": config.vocab_size,
            # Sequence heads: how the graph pools the encoder output (in the graph: the service needs nothing).
            "classifier_pooling": ((config.classifier_pooling or "cls")
                                   if head_class(spec) == "BertForSequenceClassification" else None),
        },
    }
