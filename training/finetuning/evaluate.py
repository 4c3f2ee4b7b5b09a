"""`berth evaluate`: score a fine-tuned folder or an exported bundle on a data file of its task.

Both go through the task definition's served steps (prepare -> run -> decode, as the service) and
its official metric on the decoded results; a bundle runs on ONNX Runtime as the service runs it,
so its figures are the served model's.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from tasks.runtime.bundle import MANIFEST_FILE
from tasks.runtime.inference import ItemRunner
from tasks.runtime.spec import TaskSpec
from training.errors import UserFacingError


def evaluate_model(
    model_path: str | Path, data: str | Path, data_format: str = "auto", limit: int | None = None,
    out: str | Path | None = None, device: str = "auto", columns: dict[str, str] | None = None,
) -> dict[str, float]:
    """Metrics of a `berth finetune` folder (PyTorch) or a bundle folder (ONNX Runtime, fp32/fp16/int8, without
    importing torch) on the first `limit` examples of `data`; with `out`, the report and the predictions written
    there (see `write_report`)."""
    report, predictions = evaluate_report(model_path, data, data_format, limit, device, columns)
    if out is not None:
        write_report(report, predictions, Path(out))
    return report["metrics"]


def evaluate_report(
    model_path: str | Path, data: str | Path, data_format: str = "auto", limit: int | None = None,
    device: str = "auto", columns: dict[str, str] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The report of `berth evaluate` (the task's metrics and, where the task has them, figures per label or
    entity type and a confusion matrix) and one prediction per example: its id, the served answer, the gold.
    `columns`: text_column / text_pair_column / label_column / id_column of a table file (default: those the
    model's fine-tuning run read, else text, text_pair, label, id)."""
    from tasks.definition import TaskDefinition
    from tasks.registry import definition
    from training.finetuning import task_data
    from training.finetuning.finetune import FinetuneSettings

    folder = Path(model_path)
    if not (folder / MANIFEST_FILE).is_file() and not (folder / "berth_task.json").is_file():
        raise UserFacingError(f"{folder}: neither a bundle (bundle.json) nor a finished fine-tuned folder "
                              "(berth_task.json); a run still training has none yet")
    if (folder / MANIFEST_FILE).is_file():
        spec, run, tokenizer = _bundle_runner(folder)
    else:
        spec, run, tokenizer = _torch_runner(folder, device)
    if not task_data.has_adapter(spec.task):
        raise UserFacingError(f"{folder}: a {spec.task} model has no dev data reader here (fill-mask: use `berth "
                              "pretrain --eval-only`)")
    columns = {**recorded_columns(folder), **(columns or {})}
    id_column = columns.pop("id_column", "id")
    settings = FinetuneSettings(task=spec.task, train_file=Path(data), out=folder, data_format=data_format,
                                regression=spec.problem_type == "regression", max_seq_length=spec.max_seq_length,
                                doc_stride=spec.doc_stride, max_query_length=spec.max_query_length, **columns)
    adapter = task_data.adapter_for(settings, tokenizer)
    examples = adapter.read(Path(data), limit=limit, seed=None)
    task = definition(spec.task)
    results = task.predict(tokenizer, spec, [task.served_input(e) for e in examples], run)
    if type(task).evaluate is TaskDefinition.evaluate:  # evaluating is scoring the served answers: one pass
        metrics, _ = task.score(spec, examples, results)
    else:  # a metric of its own (QA: the official script's, its v2 threshold chosen on these examples)
        metrics, _ = task.evaluate(tokenizer, spec, examples, run)
    report = {"model": str(folder), "data": str(data), "task": spec.task, "examples": len(examples),
              "metrics": metrics, **task.report(spec, examples, results)}
    ids = example_ids(Path(data), examples, id_column)
    predictions = [{"id": i, "prediction": result, "gold": gold_of(example)}
                   for i, example, result in zip(ids, examples, results)]
    return report, predictions


def recorded_columns(folder: Path) -> dict[str, str]:
    """The table columns the folder's fine-tuning run read (finetune_run.json), where it has one."""
    record = folder / "finetune_run.json"
    if not record.is_file():
        return {}
    settings = json.loads(record.read_text(encoding="utf-8")).get("settings", {})
    return {k: settings[k] for k in ("text_column", "text_pair_column", "label_column") if settings.get(k)}


def example_ids(data: Path, examples: Sequence[Any], id_column: str) -> list[Any]:
    """Each example's id: a QA question's own id; a table row's `id_column` where the file has that column;
    else its 1-based row (or sentence) number in the file."""
    if examples and hasattr(examples[0], "id"):
        return [e.id for e in examples]
    ids = _table_column(data, id_column)
    if ids is not None and len(ids) >= len(examples):
        return ids[: len(examples)]
    return [getattr(e, "line", 0) or n for n, e in enumerate(examples, start=1)]


def _table_column(path: Path, column: str) -> list[Any] | None:
    name = path.name.lower()
    try:
        if name.endswith((".jsonl", ".json")):
            rows = [json.loads(line) for line in path.open(encoding="utf-8-sig") if line.strip()]
            return [row.get(column) for row in rows] if rows and all(isinstance(r, dict) for r in rows) else None
        if name.endswith((".csv", ".tsv")):
            with path.open(encoding="utf-8-sig", newline="") as f:
                reader = csv.DictReader(f, delimiter="\t" if name.endswith(".tsv") else ",",
                                        quoting=csv.QUOTE_NONE if name.endswith(".tsv") else csv.QUOTE_MINIMAL)
                if column not in (reader.fieldnames or []):
                    return None
                return [row[column] for row in reader]
    except (ValueError, OSError):
        return None
    return None


def gold_of(example: Any) -> Any:
    """The example's reference answer as written in the file: a label, word tags, answers or a choice."""
    for name in ("label", "tags", "answers", "relevant"):
        if hasattr(example, name):
            return getattr(example, name)
    return None


def write_report(report: dict[str, Any], predictions: Sequence[dict[str, Any]], out: Path) -> Path:
    """`out`: the report as JSON; beside it `<stem>.predictions.jsonl`, one line per example in file order.
    Returns the predictions file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=_plain) + "\n", encoding="utf-8")
    predictions_file = out.with_name(f"{out.stem}.predictions.jsonl")
    with predictions_file.open("w", encoding="utf-8") as f:
        for row in predictions:
            f.write(json.dumps(row, default=_plain, ensure_ascii=False) + "\n")
    return predictions_file


def _plain(value: Any) -> Any:
    """numpy scalars and arrays, dataclasses and tuples as JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "__dataclass_fields__"):
        return {k: getattr(value, k) for k in value.__dataclass_fields__}
    return str(value)


def _torch_runner(folder: Path, device: str) -> tuple[TaskSpec, ItemRunner, Tokenizer]:
    """The folder's spec, its PyTorch head as the task definitions' runner, its tokenizer."""
    import torch

    from tasks.registry import head_class
    from tasks.runtime.tokenizer import load_tokenizer
    from training.bert import model as models
    from training.bert.checkpoint import load_pretrained
    from training.bert.torch_runner import torch_item_runner

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
