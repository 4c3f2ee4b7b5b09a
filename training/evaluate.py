"""`berth evaluate`: score a fine-tuned folder or an exported bundle on a data file of its task.

Both go through the task definition's served steps (prepare -> run -> decode, as the service) and
its official metric on the decoded results; a bundle runs on ONNX Runtime as the service runs it,
so its figures are the served model's.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from tasks.runtime.bundle import MANIFEST_FILE
from tasks.runtime.inference import ItemRunner
from tasks.runtime.spec import TaskSpec


def evaluate_model(
    model_path: str | Path, data: str | Path, data_format: str = "auto", limit: int | None = None,
    out: str | Path | None = None, device: str = "auto",
) -> dict[str, float]:
    """Metrics of a `berth finetune` folder (PyTorch) or a bundle folder (ONNX Runtime, fp32/fp16/int8, without
    importing torch) on the first `limit` examples of `data`."""
    from training import task_data
    from training.finetune import FinetuneSettings

    folder = Path(model_path)
    if (folder / MANIFEST_FILE).is_file():
        spec, run, tokenizer = _bundle_runner(folder)
    else:
        spec, run, tokenizer = _torch_runner(folder, device)
    if not task_data.has_adapter(spec.task):
        raise SystemExit(f"{folder}: a {spec.task} model has no dev data reader here (fill-mask: use `berth "
                         "pretrain --eval-only`)")
    settings = FinetuneSettings(task=spec.task, train_file=Path(data), out=folder, data_format=data_format,
                                regression=spec.problem_type == "regression", max_seq_length=spec.max_seq_length,
                                doc_stride=spec.doc_stride, max_query_length=spec.max_query_length)
    adapter = task_data.adapter_for(settings, tokenizer)
    examples = adapter.read(Path(data), limit=limit, seed=None)
    metrics, _ = adapter.evaluate(run, examples, spec)
    if out is not None:
        Path(out).write_text(json.dumps({"model": str(folder), "data": str(data), "examples": len(examples),
                                         "metrics": metrics}, indent=2) + "\n", encoding="utf-8")
    return metrics


def _torch_runner(folder: Path, device: str) -> tuple[TaskSpec, ItemRunner, Tokenizer]:
    """The folder's spec, its PyTorch head as the task definitions' runner, its tokenizer."""
    import torch

    from tasks.registry import head_class
    from tasks.runtime.tokenizer import load_tokenizer
    from training import model as models
    from training.checkpoint import load_pretrained
    from training.torch_runner import torch_item_runner

    spec = TaskSpec.load(folder)
    model, _ = load_pretrained(getattr(models, head_class(spec)), folder)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return spec, torch_item_runner(model.to(device)), load_tokenizer(folder)


def _bundle_runner(folder: Path) -> tuple[TaskSpec, ItemRunner, Tokenizer]:
    """The bundle's spec, its ONNX Runtime session (on the CPU) as the task definitions' runner, its tokenizer."""
    from tasks.bundle_checks import load_bundle
    from tasks.runtime.onnx_session import create_session, onnx_item_runner
    from tasks.runtime.tokenizer import load_tokenizer

    bundle = load_bundle(folder, verify_hashes=True)
    session, _ = create_session(bundle.model_path, bundle.precision, 0, prefer_gpu=False)
    return bundle.spec(), onnx_item_runner(session), load_tokenizer(bundle.tokenizer_path)
