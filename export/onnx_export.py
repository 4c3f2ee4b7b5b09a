"""PyTorch -> ONNX: load a fine-tuned folder and trace its head into an ONNX graph.

The TorchScript exporter (`dynamo=False`) with the explicit ("eager") attention graph is used on
purpose: it is the graph ONNX Runtime's offline transformer optimizer recognizes and fuses into its
Attention operator. Inputs are `input_ids`, `attention_mask`, `token_type_ids`
(int64, dynamic batch and sequence axes); outputs are named as the task's definition (tasks/registry.py) says.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tasks.registry import definition, head_class
from tasks.runtime.batching import MODEL_INPUT_NAMES
from tasks.runtime.spec import TASK_FILE, TaskSpec
from training.bert.checkpoint import LoadReport, load_pretrained
from training.bert.model import MODEL_CLASSES, BertPreTrainedModel

OPSET = 17

# The dynamic axes of an output: every output starts with the batch axis; per-token outputs have a sequence axis.
BATCH_AXES: dict[int, str] = {0: "batch"}
TOKEN_AXES: dict[int, str] = {0: "batch", 1: "sequence"}


class ExportError(RuntimeError):
    """The model cannot be exported as asked (not a fine-tuned folder, unknown task, invalid graph)."""


class NamedOutputs(nn.Module):
    """Wraps a berth model so that it returns a tuple of the task's outputs, in ONNX output order."""

    def __init__(self, model: BertPreTrainedModel, output_names: tuple[str, ...]):
        super().__init__()
        self.model = model
        self.output_names = output_names

    def forward(self, input_ids, attention_mask, token_type_ids):  # (B, T) int64 each
        out = self.model(input_ids, attention_mask, token_type_ids)
        return tuple(out[name] for name in self.output_names)


def load_finetuned(folder: str | Path, task: str | None = None, pooling: str | None = None
                   ) -> tuple[BertPreTrainedModel, TaskSpec, LoadReport]:
    """The model and task spec of a fine-tuned folder (HF checkpoint + berth_task.json).

    `task` stands in for a missing berth_task.json (e.g. `fill-mask` on a pretrained MLM checkpoint,
    `embedding` on any BERT folder); labels then come from config.json. An embedding's pooling,
    normalization and length come from the folder's sentence-transformers files (`pooling` overrides).
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ExportError(f"{folder}: no config.json; expected a fine-tuned checkpoint folder")
    if (folder / TASK_FILE).is_file():
        spec = TaskSpec.load(folder)
        if task and task != spec.task:
            raise ExportError(f"{folder / TASK_FILE} says task {spec.task!r}, not {task!r}")
    elif task:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        spec = definition(task).spec_from_checkpoint(folder, config, pooling)
    else:
        raise ExportError(f"{folder}: no {TASK_FILE}; is it a berth fine-tuned folder? (or name the task with --task)")
    model_class = MODEL_CLASSES[head_class(spec)]
    overrides = definition(spec.task).head_overrides(spec)
    model, report = load_pretrained(model_class, folder, **overrides)
    model.eval()
    return model, spec, report


def export_onnx(model: BertPreTrainedModel, task: str, path: str | Path, opset: int = OPSET) -> Path:
    """Trace `model` (a head of `task`) into `path` and check it with `onnx.checker`.

    Switches the model to the eager attention graph for the trace (and back afterwards).
    """
    import onnx

    path = Path(path)
    task_definition = definition(task)
    output_names = task_definition.output_names
    previous = _attention_implementation(model)
    model.set_attention_implementation("eager")
    wrapper = NamedOutputs(model, output_names).eval()
    # Two rows of different lengths, so padding is part of the traced graph's inputs.
    input_ids = torch.tensor([[101, 7592, 2088, 2003, 2307, 1012, 102, 0], [101, 7592, 102, 0, 0, 0, 0, 0]])
    attention_mask = (input_ids != 0).long()
    token_type_ids = torch.zeros_like(input_ids)
    dynamic_axes = {name: {0: "batch", 1: "sequence"} for name in MODEL_INPUT_NAMES}
    dynamic_axes.update({name: TOKEN_AXES if task_definition.is_token_output(name) else BATCH_AXES
                         for name in output_names})
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(
                wrapper,
                (input_ids, attention_mask, token_type_ids),
                str(path),
                input_names=list(MODEL_INPUT_NAMES),
                output_names=list(output_names),
                dynamic_axes=dynamic_axes,
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
            )
    finally:
        model.set_attention_implementation(previous)
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as error:
        raise ExportError(f"{path}: the exported graph fails onnx.checker: {error}") from error
    return path


def graph_io(path: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The inputs and outputs of an ONNX file as manifest entries: name, dtype and shape (axis names or sizes)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)

    def describe(value: Any) -> dict[str, Any]:
        tensor = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        shape = [dim.dim_param or dim.dim_value for dim in tensor.shape.dim]
        return {"name": value.name, "dtype": dtype, "shape": shape}

    return [describe(v) for v in model.graph.input], [describe(v) for v in model.graph.output]


def _attention_implementation(model: BertPreTrainedModel) -> str:
    for module in model.modules():
        if hasattr(module, "implementation"):
            return module.implementation
    return "sdpa"
