"""Every task definition, by task name: the one lookup the service, training, export and evaluation use.

A new task is a module of the task layer defining `DEFINITIONS` (its `TaskDefinition`s), named here,
plus its head in training/model.py.
"""

from __future__ import annotations

from importlib import import_module

from tasks.definition import TaskDefinition

TASK_MODULES = ("classification", "ner", "qa", "fill_mask", "embedding", "multiple_choice")

DEFINITIONS: dict[str, TaskDefinition] = {
    definition.name: definition
    for module in TASK_MODULES
    for definition in import_module(f"tasks.{module}").DEFINITIONS
}
TASK_NAMES = tuple(DEFINITIONS)


def definition(task: str) -> TaskDefinition:
    """The definition of `task`; KeyError naming the known tasks."""
    try:
        return DEFINITIONS[task]
    except KeyError:
        raise KeyError(f"unknown task {task!r}; known tasks: {', '.join(TASK_NAMES)}") from None
