"""The batch-invariance gate: an item's answer must not depend on what else is in its forward pass.

A server batches whatever requests arrive together, and `berth predict` packs a file's rows by length, so
the same input runs alone, or padded among neighbours of other lengths, depending on the load. Every model
input of the dev slice is run alone (a pass of its own, padded as the service pads) and then inside passes of
random neighbours from the slice (`SIZES`, mixed lengths, so more padding and another position), on the
bundle's own session. Recorded: the largest |Δ| of any output at the item's real positions between the two,
and how many examples' task answers (label, entity spans, answer span) changed. A bundle whose outputs move
more than `MAX_ABS_DIFF` fails the export (`InvarianceError`), unless the caller asks to ship it marked
batch-dependent.

fp32 moves by float noise (~1e-7: matrix kernels sum in another order for another batch shape). Dynamic int8
with one activation scale per batch tensor moved the default models' outputs by up to ~0.3 (logits); with one
scale per token row (export/rowwise_quant.py) by float noise again: a value a hair from a rounding boundary can
still land on the other code, so the bound leaves room for that, far below any answer-changing move.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from export.parity import ParityError, ParityExample, task_answer
from tasks.registry import definition
from tasks.runtime.inference import Batch, Runner, run_batch
from tasks.runtime.spec import TaskSpec

# The largest |Δ| of any raw output (logits, scores, vectors) between an item alone and in a batch.
MAX_ABS_DIFF = 1e-3
SIZES = (8, 32)  # batch sizes of the neighbour passes (the item plus random neighbours)
PAD_MULTIPLE = 8  # as the service pads on the CPU


class InvarianceError(ParityError):
    """The bundle's outputs depend on their batch neighbours beyond `MAX_ABS_DIFF`; `report` has the figures.
    A kind of ParityError, so whatever falls back on a failed gate (build-defaults' recipe chain) does here too."""

    def __init__(self, report: dict[str, Any]):
        self.report = report
        RuntimeError.__init__(self, format_invariance(report))


def _width(items: Sequence[Any], members: Sequence[int]) -> int:
    longest = max(len(items[i]) for i in members)
    return -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE


def batch_invariance(spec: TaskSpec, examples: list[ParityExample], runner: Runner, sizes: Sequence[int] = SIZES,
                     seed: int = 0, max_abs_diff: float = MAX_ABS_DIFF) -> dict[str, Any]:
    """Run every model input of `examples` alone and in passes of `sizes` with random neighbours; the report."""
    task = definition(spec.task)
    names = task.output_names
    token_outputs = {name for name in names if task.is_token_output(name)}
    flat = [(e, feature) for e, example in enumerate(examples) for feature in example.features]
    items = [feature for _, feature in flat]
    alone = [run_batch(runner, items, Batch((i,), _width(items, (i,))), token_outputs)[0] for i in range(len(items))]
    worst = {name: 0.0 for name in names}
    changed: set[int] = set()
    rng = random.Random(seed)
    reference = _answers(spec, examples, flat, alone)
    passes = 0
    for size in sizes:
        order = list(range(len(items)))
        rng.shuffle(order)
        batched: list[dict[str, np.ndarray] | None] = [None] * len(items)
        for at in range(0, len(order), size):
            members = order[at : at + size]
            if len(members) < size:  # the last pass: fill it up with neighbours already measured
                members += rng.sample([i for i in order if i not in members], min(size - len(members),
                                                                                   len(order) - len(members)))
            # The item at every position of the pass: shuffled, not sorted by length as a planner would.
            rows = run_batch(runner, items, Batch(tuple(members), _width(items, members)), token_outputs)
            passes += 1
            for i, row in zip(members, rows):
                if batched[i] is None:
                    batched[i] = row
                for name in names:
                    diff = np.abs(np.asarray(row[name], np.float64) - np.asarray(alone[i][name], np.float64))
                    worst[name] = max(worst[name], float(diff.max()) if diff.size else 0.0)
        answers = _answers(spec, examples, flat, batched)  # type: ignore[arg-type]
        changed |= {e for e, (a, b) in enumerate(zip(reference, answers)) if a != b}
    largest = max(worst.values()) if worst else 0.0
    return {
        "passed": bool(largest <= max_abs_diff),
        "max_abs_diff": largest,
        "max_abs_diff_by_output": worst,
        "threshold": {"max_abs_diff": max_abs_diff},
        "changed_answers": len(changed),
        "changed_answers_per_1000": round(1000 * len(changed) / max(len(examples), 1), 2),
        "examples": len(examples),
        "model_inputs": len(items),
        "batch_sizes": list(sizes),
        "passes": passes,
        "sequence_lengths": [min(map(len, items)), max(map(len, items))] if items else [],
        "measure": "each model input alone vs inside passes of random neighbours from the dev slice "
                   "(mixed lengths, padded to the longest rounded to 8): max |Δ| of every output at its real "
                   "positions; examples whose task answer changed in any pass",
    }


def _answers(spec: TaskSpec, examples: list[ParityExample], flat: list[tuple[int, Any]],
             rows: Sequence[dict[str, np.ndarray]]) -> list[Any]:
    task = definition(spec.task)
    per_example: list[list[dict[str, np.ndarray]]] = [[] for _ in examples]
    for (e, _), row in zip(flat, rows):
        kept = {name: np.array(task.kept_rows(examples[e].prepared, name, value)) for name, value in row.items()}
        per_example[e].append(kept)
    return [_hashable(task_answer(spec, example, outputs)) for example, outputs in zip(examples, per_example)]


def _hashable(answer: Any) -> Any:
    if isinstance(answer, float):  # a regression score: compare at the precision the service answers
        return round(answer, 4)
    if isinstance(answer, tuple) and answer and isinstance(answer[0], float):  # an embedding
        return tuple(round(v, 4) for v in answer)
    return answer


def format_invariance(report: dict[str, Any]) -> str:
    verdict = "passed" if report["passed"] else "FAILED"
    return (f"batch invariance {verdict}: max |Δ| {report['max_abs_diff']:.3g} between an input alone and in "
            f"batches of {'/'.join(map(str, report['batch_sizes']))} random neighbours (at most "
            f"{report['threshold']['max_abs_diff']:g}); {report['changed_answers']} of {report['examples']} "
            f"examples changed their answer")
