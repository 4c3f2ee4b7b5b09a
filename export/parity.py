"""The parity gate: the ONNX model must answer as the PyTorch model does, on real inputs of its task.

Both run on the same padded batches of a real dev slice (mixed lengths, so padding; pairs for
`pair`; several windows of long SQuAD contexts and long CoNLL documents), and are compared twice:
- numerically: max |Δ| over every output at real (unpadded) positions;
- by task: the decoded answer of each example (label, entity spans, answer span, masked-token
  prediction) must be the same.
fp32 must stay within `FP32_MAX_ABS_DIFF`. fp16 and int8 move logits by design; what matters is
whether they change answers that mattered, so they are gated twice:
- agreement where the reference is confident: among the examples whose reference answer leads its
  runner-up by at least `CONFIDENT_MARGIN` in probability, at least `MIN_AGREEMENT` must get the
  same task answer (a flip on an example both engines score ~50/50 is not a regression). With fewer
  than `MIN_CONFIDENT` confident examples (an untrained head) and no metric check, every example counts;
- the task metric (`metric_gate`): on a dev slice with gold answers (the model's own dev file), the
  headline metric must not fall more than `MAX_METRIC_DROP` points below the reference's.
Figures go into the manifest.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from tasks.definition import ItemOutputs, Prepared
from tasks.embedding import EMBEDDING_MIN_COSINE
from tasks.registry import definition
from tasks.runtime.inference import ItemRunner, Runner, iter_batches, offline_shape
from tasks.runtime.spec import TaskSpec
from tasks.shipped_samples import SAMPLES

log = logging.getLogger(__name__)

FP32_MAX_ABS_DIFF = 1e-4
MIN_AGREEMENT = 0.99
CONFIDENT_MARGIN = 0.2  # top-1 minus runner-up probability of the reference answer
MIN_CONFIDENT = 20
MAX_METRIC_DROP = 0.5  # points (of a metric in %)
# The examples of the dev slices are each task definition's `parity_examples` (enough that 99% agreement
# tolerates an odd flip, few enough that the gate takes well under a minute on 2 CPU cores) and
# `metric_examples` (with paired answers, one changed answer moves the metric by 100 / n points, so
# 0.5 point is a handful of net changes on these sizes, not one).
# A regression score agrees within 10% of the slice's score range (at least 0.01): on STS-B's 0-5 scale about a
# quarter point, below the resolution of its gold scores (means of a few integer ratings). 1% (0.03) refused int8
# exports whose Pearson moved 0.1 point; the task metric on gold (MAX_METRIC_DROP) is the finer guard.
REGRESSION_TOLERANCE = 0.10

REPO = Path(__file__).resolve().parents[1]


class ParityError(RuntimeError):
    """The ONNX model disagrees with PyTorch beyond the precision's threshold; `report` has the figures."""

    def __init__(self, report: dict[str, Any]):
        self.report = report
        super().__init__(format_report(report))


@dataclass
class ParityExample:
    """One dev input, prepared as its task definition prepares it for serving (or for the gate)."""

    id: str
    prepared: Prepared

    @property
    def features(self) -> Sequence[Any]:  # EncodedInput / QAWindow: has input_ids, token_type_ids, len()
        return self.prepared.items


def default_data_dir() -> Path | None:
    """$BERTH_SHARED_DATA, else ../shared/data beside the repository, if it exists."""
    path = Path(os.environ.get("BERTH_SHARED_DATA", REPO.parent / "shared" / "data"))
    return path if path.is_dir() else None


# -- the dev slice -----------------------------------------------------------------------------------


def parity_slice(spec: TaskSpec, tokenizer: Tokenizer, data_dir: Path | None, size: int,
                 dev_file: Path | None = None, columns: dict[str, str] | None = None,
                 ) -> tuple[list[ParityExample], str]:
    """`size` real examples of the task, prepared with the spec's settings, and where they came from: the model's
    own `dev_file` where there is one (read as fine-tuning read it, with its table `columns`), else the task's
    shipped sample (or its public set in `data_dir`), else built-in inputs."""
    task = definition(spec.task)
    if dev_file is not None:
        raws = own_inputs(spec, tokenizer, dev_file, size, columns)
        source = str(dev_file)
    else:
        path = _first_file(data_dir, *task.parity_files) if task.parity_files else None
        raws, source = task.parity_inputs(path, size), str(path) if path else "built-in inputs"
    examples = [ParityExample(str(getattr(raw, "id", "") or f"{spec.task}-{i}"),
                              task.prepare_parity(tokenizer, spec, raw))
                for i, raw in enumerate(raws)]
    return examples, source


def own_inputs(spec: TaskSpec, tokenizer: Tokenizer, dev_file: Path, size: int,
               columns: dict[str, str] | None = None) -> list[Any]:
    """The first `size` inputs of a model's dev file as a client would send them. A task whose gate prepares inputs
    of its own shape (multiple choice: one context-choice pair at a time) reads the file its own way."""
    from export.calibration import adapter
    from tasks.definition import TaskDefinition

    task = definition(spec.task)
    if type(task).prepare_parity is not TaskDefinition.prepare_parity:
        return task.parity_inputs(dev_file, size)
    examples = adapter(spec, tokenizer, dev_file, columns).read(dev_file, limit=size, seed=None)
    return [task.served_input(example) for example in examples]


def _first_file(data_dir: Path | None, shared: str, sample: str | None) -> Path | None:
    for path in ((data_dir / shared) if data_dir else None, (SAMPLES / sample) if sample else None):
        if path is not None and path.is_file():
            return path
    return None


# -- running both engines ------------------------------------------------------------------------------


def run_pair(
    examples: list[ParityExample], task: str, reference: Runner, candidate: Runner, batch_size: int = 8
) -> tuple[dict[str, Any], list[list[ItemOutputs]], list[list[ItemOutputs]]]:
    """Run both engines on the same padded batches; return the numeric diffs and, per example, the
    outputs of each of its items as decoding takes them (per-token rows trimmed to the item)."""
    task_definition = definition(task)
    task_outputs = task_definition.output_names
    flat = [(i, feature) for i, example in enumerate(examples) for feature in example.features]
    kept: list[list[list[ItemOutputs]]] = [[[] for _ in examples] for _ in range(2)]
    max_diff = {name: 0.0 for name in task_outputs}
    sum_diff, count = 0.0, 0
    lengths, batch_sizes = [], []
    features = [feature for _, feature in flat]
    token_outputs = {name for name in task_outputs if task_definition.is_token_output(name)}
    by_feature: list[list[ItemOutputs]] = [[{} for _ in flat] for _ in range(2)]

    def run_both(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ref, cand = reference(feeds), candidate(feeds)
        return {**{f"reference/{n}": ref[n] for n in task_outputs}, **{f"candidate/{n}": cand[n] for n in task_outputs}}

    # The service's path (tasks/runtime/inference.py): sorted by length, padded to the batch's longest rounded to 8.
    trimmed = {f"{side}/{name}" for side in ("reference", "candidate") for name in token_outputs}
    for batch, rows in iter_batches(run_both, features, trimmed, offline_shape(features, batch_size)):
        lengths += [len(features[i]) for i in batch.members]
        batch_sizes.append(len(batch.members))
        for i, row in zip(batch.members, rows):
            prepared = examples[flat[i][0]].prepared
            for name in task_outputs:
                ref, cand = row[f"reference/{name}"], row[f"candidate/{name}"]  # real positions only
                diff = np.abs(ref.astype(np.float64) - cand.astype(np.float64))
                max_diff[name] = max(max_diff[name], float(diff.max()) if diff.size else 0.0)
                sum_diff += float(diff.sum())
                count += diff.size
                for side, array in enumerate((ref, cand)):
                    by_feature[side][i][name] = np.array(task_definition.kept_rows(prepared, name, array))
    for side in range(2):  # each example's items in their own order
        for i, (example_index, _) in enumerate(flat):
            kept[side][example_index].append(by_feature[side][i])
    figures = {
        "max_abs_diff": max(max_diff.values()),
        "max_abs_diff_by_output": max_diff,
        "mean_abs_diff": sum_diff / max(count, 1),
        "features": len(flat),
        "sequence_lengths": [min(lengths), max(lengths)] if lengths else [],
        "batch_sizes": sorted(set(batch_sizes)),
        "padded_batches": True,
    }
    return figures, kept[0], kept[1]


# -- task-level answers ---------------------------------------------------------------------------------


def task_answer(spec: TaskSpec, example: ParityExample, outputs: Sequence[ItemOutputs]) -> Hashable:
    """What the service would answer for this example, reduced to what must not change."""
    return definition(spec.task).parity_answer(None, spec, example.prepared, outputs)


def confidence(spec: TaskSpec, example: ParityExample, outputs: Sequence[ItemOutputs]) -> float:
    """How clearly the reference prefers its answer: top-1 minus runner-up probability (1.0: always counts,
    e.g. a regression score or an embedding, whose agreement is a tolerance or a cosine)."""
    return definition(spec.task).confidence(spec, example.prepared, outputs)


def _agree(a: Hashable, b: Hashable, tolerance: float | None) -> bool:
    if isinstance(a, tuple) and a and isinstance(a[0], float):  # an embedding
        u, v = np.asarray(a), np.asarray(b)
        return float(u @ v / max(np.linalg.norm(u) * np.linalg.norm(v), 1e-12)) >= EMBEDDING_MIN_COSINE
    if tolerance is not None:
        return abs(float(a) - float(b)) <= tolerance
    return a == b


def check_parity(
    spec: TaskSpec,
    examples: list[ParityExample],
    reference: Runner,
    candidate: Runner,
    precision: str,
    provider: str,
    source: str = "",
    batch_size: int = 8,
    raise_on_failure: bool = True,
    min_agreement: float = MIN_AGREEMENT,
    metric_checked: bool = False,
) -> dict[str, Any]:
    """Compare `candidate` (ONNX) with `reference` (PyTorch) on `examples`; the report for the manifest.

    Raises `ParityError` (its message is the report) when the precision's threshold is not met:
    max |Δ| <= FP32_MAX_ABS_DIFF for fp32; for fp16 and int8, task agreement >= `min_agreement`
    among the examples where the reference is confident (see the module docstring).
    """
    figures, ref_outputs, cand_outputs = run_pair(examples, spec.task, reference, candidate, batch_size)
    ref_answers = [task_answer(spec, e, o) for e, o in zip(examples, ref_outputs)]
    cand_answers = [task_answer(spec, e, o) for e, o in zip(examples, cand_outputs)]
    tolerance = None
    if ref_answers and isinstance(ref_answers[0], float):
        spread = max(ref_answers) - min(ref_answers)
        tolerance = max(0.01, REGRESSION_TOLERANCE * spread)
    agreed = [_agree(a, b, tolerance) for a, b in zip(ref_answers, cand_answers)]
    agreement = sum(agreed) / max(len(agreed), 1)
    margins = [confidence(spec, e, o) for e, o in zip(examples, ref_outputs)]
    confident = [ok for ok, m in zip(agreed, margins) if m >= CONFIDENT_MARGIN]
    # Too few confident examples (a barely trained head): every example counts, unless the task metric
    # on gold answers is checked too (`metric_checked`), which then decides for the unconfident ones.
    fallback = len(confident) < MIN_CONFIDENT and not metric_checked
    confident_counted = agreed if fallback else confident
    # No confident example at all (with a metric check): nothing here can be a regression; the metric decides.
    confident_agreement = sum(confident_counted) / len(confident_counted) if confident_counted else 1.0
    if precision == "fp32":
        threshold = {"max_abs_diff": FP32_MAX_ABS_DIFF}
        passed = figures["max_abs_diff"] <= FP32_MAX_ABS_DIFF
    else:
        threshold = {"confident_agreement": min_agreement}
        passed = confident_agreement >= min_agreement
    report = {
        "precision": precision,
        "provider": provider,
        "passed": bool(passed),
        "threshold": threshold,
        "max_abs_diff": figures["max_abs_diff"],
        "mean_abs_diff": figures["mean_abs_diff"],
        "agreement": agreement,
        "confident_agreement": confident_agreement,
        "confident_examples": len(confident_counted),
        "confident_fallback_all_examples": fallback,
        "confident_margin": CONFIDENT_MARGIN,
        "agreement_measure": _agreement_measure(spec, tolerance),
        "examples": len(examples),
        **{k: v for k, v in figures.items() if k not in ("max_abs_diff", "mean_abs_diff")},
        "data": source,
        "disagreements": [
            {"id": e.id, "reference_margin": round(m, 4), **_first_difference(a, b)}
            for e, a, b, ok, m in zip(examples, ref_answers, cand_answers, agreed, margins) if not ok
        ][:5],
    }
    if not passed and raise_on_failure:
        raise ParityError(report)
    return report


def _confident_phrase(report: dict[str, Any]) -> str:
    if report.get("confident_fallback_all_examples"):
        return f"counted over all of them (fewer than {MIN_CONFIDENT} where the reference is confident)"
    phrase = (f"{report['confident_agreement']:.2%} of the {report['confident_examples']} where the reference is "
              f"confident (margin >= {report['confident_margin']:g})")
    if report["precision"] == "fp32":
        phrase += "; for information: fp32 is gated on max |Δ|"
    elif report["confident_examples"] < MIN_CONFIDENT and report.get("metric"):
        phrase += "; few are confident, so the task-metric gate on gold answers decides"
    return phrase


def _agreement_measure(spec: TaskSpec, tolerance: float | None) -> str:
    if tolerance is not None:
        return f"regression score within {tolerance:.4g}"
    return definition(spec.task).agreement


def _first_difference(a: Hashable, b: Hashable, context: int = 2) -> dict[str, Any]:
    """The two answers, cut to a few items around where they first differ when they are long lists."""
    if (isinstance(a, tuple) and isinstance(b, tuple) and a and isinstance(a[0], tuple)
            and max(len(a), len(b)) > 2 * context):
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        lo = max(0, at - context)
        return {"from_item": lo, "pytorch": _jsonable(a[lo : at + context]), "onnx": _jsonable(b[lo : at + context]),
                "items": [len(a), len(b)]}
    return {"pytorch": _jsonable(a), "onnx": _jsonable(b)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def format_report(report: dict[str, Any]) -> str:
    """One paragraph a person can act on: what was compared, the figures, the verdict."""
    verdict = "passed" if report["passed"] else "FAILED: the bundle is not written"
    limit = ", ".join(f"{k} {'>=' if k == 'confident_agreement' else '<='} {v:g}"
                      for k, v in report["threshold"].items())
    lines = [
        f"parity gate {verdict} ({report['precision']} ONNX on {report['provider']} against PyTorch; required: "
        f"{limit}):",
        f"  max |Δ| {report['max_abs_diff']:.3g} (by output: "
        + ", ".join(f"{k} {v:.3g}" for k, v in report["max_abs_diff_by_output"].items())
        + f"), mean |Δ| {report['mean_abs_diff']:.3g}",
        f"  task agreement {report['agreement']:.2%} of {report['examples']} examples, " + _confident_phrase(report)
        + f" ({report['agreement_measure']}); {report['features']} model inputs of "
        f"{report['sequence_lengths'][0]}-{report['sequence_lengths'][1]} tokens; data: {report['data']}",
    ]
    for item in report["disagreements"]:
        where = f" (items {item['from_item']}.. of {item['items'][0]} vs {item['items'][1]})" if "items" in item else ""
        lines.append(f"  differs: {item['id']}{where} (reference margin {item['reference_margin']:.2f}): "
                     f"pytorch {item['pytorch']} vs onnx {item['onnx']}")
    if report.get("metric"):
        lines.append(f"  {format_metric(report['metric'])}")
    return "\n".join(lines)


# -- the task metric on the model's own dev set ------------------------------------------------------------


def metric_gate(
    spec: TaskSpec, tokenizer: Tokenizer, dev_file: Path, reference: ItemRunner, candidate: ItemRunner,
    limit: int | None = None, max_drop: float = MAX_METRIC_DROP, columns: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Score `reference` and `candidate` on the first `limit` examples of `dev_file` with the task's official
    metric; passed when the candidate's headline metric is at most `max_drop` points lower."""
    from export.calibration import adapter

    task = adapter(spec, tokenizer, dev_file, columns)
    examples = task.read(dev_file, limit=limit or definition(spec.task).metric_examples, seed=None)
    ref_metrics, _ = task.evaluate(reference, examples, spec)
    cand_metrics, _ = task.evaluate(candidate, examples, spec)
    name, scale = definition(spec.task).headline_metric(ref_metrics)
    ref_value, cand_value = ref_metrics[name] * scale, cand_metrics[name] * scale
    return {
        "name": name,
        "reference": round(ref_value, 3),
        "candidate": round(cand_value, 3),
        "delta_points": round(cand_value - ref_value, 3),
        "max_drop_points": max_drop,
        "passed": bool(cand_value >= ref_value - max_drop),
        "examples": len(examples),
        "data": str(dev_file),
        "reference_metrics": ref_metrics,
        "candidate_metrics": cand_metrics,
    }


def format_metric(figures: dict[str, Any]) -> str:
    verdict = "passed" if figures["passed"] else "FAILED"
    return (f"task-metric gate {verdict}: {figures['name']} {figures['candidate']:.2f} "
            f"vs reference {figures['reference']:.2f} ({figures['delta_points']:+.2f} points, "
            f"at most -{figures['max_drop_points']:g} allowed) on {figures['examples']} examples of {figures['data']}")
