"""Batch-invariant int8: an input's scores do not depend on what else is in its forward pass.

With one activation scale per batch tensor (ONNX Runtime's dynamic quantization) an item's int8 outputs move
with its neighbours and their padding; with one scale per token row (export/rowwise_quant.py, the default
recipe) they do not. Measured on the real all-MiniLM-L6-v2 checkpoint and the fine-tuned test heads of every
task, with real SST-2 / CoNLL / SQuAD inputs: an input alone, then first and last in a pass of 32 mixed-length
neighbours. The tolerance (1e-4 in probability) is the issue's; the per-tensor recipe's move (above 1e-3) is what
the mechanism predicts and what was measured before the change (up to 0.08 in probability on the defaults).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from export import invariance, parity, precision  # noqa: E402
from export.bundle_builder import export_bundle  # noqa: E402
from export.onnx_export import export_onnx, load_finetuned  # noqa: E402
from export.settings import ExportSettings  # noqa: E402
from tasks.registry import definition  # noqa: E402
from tasks.runtime.inference import Batch, run_batch  # noqa: E402
from tasks.runtime.onnx_session import create_session, onnx_runner  # noqa: E402
from tasks.runtime.tokenizer import load_tokenizer  # noqa: E402

PROBABILITY_TOLERANCE = 1e-4
PER_TENSOR = "dynamic-keep-early-ffn-emb8"  # what shipped before: one activation scale per batch tensor
pytestmark = pytest.mark.skipif(parity.default_data_dir() is None, reason="needs ../shared/data")


def probabilities(task: str, name: str, values: np.ndarray) -> np.ndarray:
    """What the service turns an output into: softmax over labels (classification, NER), over positions (QA
    start / end logits); a regression score as it is."""
    values = np.asarray(values, np.float64)
    if task == "pair" and values.shape[-1] == 1 or name == "sentence_embedding":
        return values
    shifted = np.exp(values - values.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def largest_move(folder: Path, recipe: str, tmp_path: Path, probes: int = 8) -> float:
    """Largest change of any probability when a dev input runs alone vs first / last among 31 neighbours."""
    model, spec, _ = load_finetuned(folder, "embedding" if folder.name == "model" else None)
    plain = export_onnx(model, spec.task, tmp_path / f"{folder.name}-plain.onnx")
    graph = precision.to_int8(plain, tmp_path / f"{folder.name}-{recipe}.onnx", recipe)
    runner = onnx_runner(create_session(graph, "int8", 2, prefer_gpu=False)[0], definition(spec.task).output_names)
    examples, _ = parity.parity_slice(spec, load_tokenizer(folder), parity.default_data_dir(), 48)
    items = [feature for example in examples for feature in example.features]
    assert len({len(item) for item in items}) > 8  # mixed lengths: padding differs between the passes
    task = definition(spec.task)
    token = {name for name in task.output_names if task.is_token_output(name)}

    def rows(members: list[int]) -> list[dict[str, np.ndarray]]:
        width = -(-max(len(items[i]) for i in members) // 8) * 8
        return run_batch(runner, items, Batch(tuple(members), width), token)

    worst = 0.0
    for probe in range(probes):
        alone = rows([probe])[0]
        neighbours = [i for i in range(len(items)) if i != probe][::-1][:31]
        for position in (0, 31):
            members = neighbours[:position] + [probe] + neighbours[position:]
            batched = rows(members)[position]
            for name in task.output_names:
                a, b = probabilities(spec.task, name, alone[name]), probabilities(spec.task, name, batched[name])
                worst = max(worst, float(np.abs(a - b).max()))
    return worst


@pytest.mark.parametrize("model", ["sentiment", "similarity", "entities", "reader"])
def test_the_default_int8_recipe_answers_an_input_alike_alone_and_in_a_batch(checkpoints, model, tmp_path):  # noqa: F811
    assert precision.RECIPES[precision.DEFAULT_RECIPE].activation_scales == "row"
    assert largest_move(checkpoints[model], precision.DEFAULT_RECIPE, tmp_path) <= PROBABILITY_TOLERANCE


def test_one_scale_per_batch_tensor_moves_the_same_input(base_path, tmp_path):
    """The contrast (and what the gate must catch): the per-tensor recipe on the real sentence-transformers model."""
    assert largest_move(base_path, PER_TENSOR, tmp_path) > 1e-3
    assert largest_move(base_path, precision.DEFAULT_RECIPE, tmp_path) <= PROBABILITY_TOLERANCE


def test_the_export_gate_refuses_a_batch_dependent_bundle_unless_asked_to_mark_it(checkpoints, tmp_path):  # noqa: F811
    options = {"model_folder": checkpoints["sentiment"], "precision": "int8", "optimize": "never",
               "parity_examples": 48, "threads": 2}
    with pytest.raises(invariance.InvarianceError, match="batch invariance FAILED"):
        export_bundle(ExportSettings(out=tmp_path / "per-tensor", int8_recipe=PER_TENSOR, **options))
    assert not (tmp_path / "per-tensor").exists()  # nothing half-built where a server would look
    marked = export_bundle(ExportSettings(out=tmp_path / "marked", int8_recipe=PER_TENSOR, allow_batch_dependent=True,
                                          **options))
    assert marked.batch_invariance["batch_dependent"] is True
    assert marked.batch_invariance["max_abs_diff"] > invariance.MAX_ABS_DIFF
    shipped = export_bundle(ExportSettings(out=tmp_path / "rowwise", **options))
    figures = shipped.batch_invariance
    assert figures["batch_dependent"] is False and figures["max_abs_diff"] <= invariance.MAX_ABS_DIFF
    assert figures["changed_answers"] == 0 and figures["examples"] == 48 and figures["batch_sizes"] == [8, 32]
