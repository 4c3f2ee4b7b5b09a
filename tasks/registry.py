"""Every task definition, by task name: the one lookup the service, training, export and evaluation use.

A new task is a module of the task layer defining `DEFINITIONS` (its `TaskDefinition`s), imported and listed
here, plus its head in training/bert/model.py.
"""

from __future__ import annotations

from tasks import classification, embedding, fill_mask, multiple_choice, ner, qa, rerank
from tasks.definition import TaskDefinition
from tasks.runtime.spec import TaskSpec

TASK_MODULES = (classification, ner, qa, embedding, fill_mask, multiple_choice, rerank)  # the order of the routes

DEFINITIONS: dict[str, TaskDefinition] = {
    definition.name: definition for module in TASK_MODULES for definition in module.DEFINITIONS
}
TASK_NAMES = tuple(DEFINITIONS)


def definition(task: str) -> TaskDefinition:
    """The definition of `task`; KeyError naming the known tasks."""
    try:
        return DEFINITIONS[task]
    except KeyError:
        raise KeyError(f"unknown task {task!r}; known tasks: {', '.join(TASK_NAMES)}") from None


def head_class(spec: TaskSpec) -> str:
    """The model class of training/bert/model.py that `spec` is a model of: the task's, unless the spec names its own
    (feature-based NER's)."""
    return spec.extra.get("head_class") or definition(spec.task).head_class
