"""The task layer's checks of a bundle, and `load_bundle`, which reads a bundle with them.

The runtime floor (tasks/runtime/bundle.py) reads and verifies a bundle (files, hashes, digest, signature) and
knows no task; what the bundle's task asks of its manifest is checked here, through the registry: a known task,
the task's outputs, labels that match the graph's logits, examples that are valid inputs of the task's route.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.registry import definition
from tasks.runtime.bundle import Bundle, BundleError, TaskChecks, read_bundle


def load_bundle(folder: str | Path, verify_hashes: bool = True, public_key: Any = None) -> Bundle:
    """Read and check the bundle in `folder` with its task's checks (`read_bundle` says what is checked, in which
    order); raise `BundleError` naming the problem when it is unfit."""
    return read_bundle(folder, TASK_CHECKS, verify_hashes, public_key)[0]


def known_task(task: str) -> None:
    try:
        definition(task)
    except KeyError as error:
        raise ValueError(error.args[0]) from None


def check_consistency(bundle: Bundle, manifest_path: Path) -> None:
    task = definition(bundle.task)
    expected_outputs = list(task.output_names)
    if bundle.output_names != expected_outputs:
        raise BundleError(
            f"{manifest_path}: task {bundle.task!r} expects outputs {expected_outputs}, "
            f"manifest lists {bundle.output_names}"
        )
    if task.needs_labels(bundle.problem_type) and not bundle.labels:
        raise BundleError(f"{manifest_path}: task {bundle.task!r} needs labels (problem_type {bundle.problem_type!r})")
    check_label_count(bundle, {tensor.name: tensor.shape for tensor in bundle.outputs}, f"{manifest_path} (outputs)")
    try:
        check_examples(bundle.task, bundle.examples)
    except BundleError as error:
        raise BundleError(f"{manifest_path}: {error}") from None


def check_label_count(bundle: Bundle, output_shapes: dict[str, list[Any]], where: str) -> None:
    """Raise BundleError when the labels do not match the width of the graph's `logits` (its last axis, where the
    graph states it): decoding would fail on every request. `output_shapes`: the manifest's outputs, or the
    loaded session's (ONNX Runtime's `get_outputs()`), whichever the caller has."""
    shape = output_shapes.get("logits")
    if not bundle.labels or not shape or not isinstance(shape[-1], int) or not definition(bundle.task).needs_labels(
            bundle.problem_type):
        return
    if shape[-1] != len(bundle.labels):
        raise BundleError(f"{where}: the graph's logits have {shape[-1]} values a row but the manifest lists "
                          f"{len(bundle.labels)} labels ({', '.join(bundle.labels[:8])}"
                          f"{', ...' if len(bundle.labels) > 8 else ''}); re-export the bundle")


def check_examples(task: str, examples: list[Any]) -> None:
    """Raise BundleError unless every example is one valid `inputs` value of the task's route."""
    if not isinstance(examples, list):
        raise BundleError(f"examples must be a list, found {type(examples).__name__}")
    fields = definition(task).input_fields or None
    for index, example in enumerate(examples):
        where = f"examples[{index}] ({task})"
        if fields is None:
            if not _is_text(example):
                raise BundleError(f"{where}: expected a non-empty text, found {example!r:.80}")
            continue
        if not isinstance(example, dict) or set(example) != set(fields):
            raise BundleError(f"{where}: expected an object with exactly the fields {', '.join(fields)}")
        for name in fields:
            value = example[name]
            if name == "choices":
                if not (isinstance(value, list) and len(value) >= 2 and all(map(_is_text, value))):
                    raise BundleError(f"{where}: choices must be a list of 2 or more non-empty texts")
            elif name == "documents":
                if not (isinstance(value, list) and value and all(map(_is_text, value))):
                    raise BundleError(f"{where}: documents must be a list of 1 or more non-empty texts")
            elif not _is_text(value):
                raise BundleError(f"{where}: {name} must be a non-empty text")


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


TASK_CHECKS = TaskChecks(known_task=known_task, consistent=check_consistency)
