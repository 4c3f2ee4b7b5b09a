"""Command-line flags generated from a pydantic settings model, so that a setting is declared once.

Each field becomes a flag: `--field-name` (or the names the command gives, e.g. the short `--lr`),
its type and choices from the annotation, its help from the field's description followed by its
default (and its `BERTH_*` variable for the service). A bool defaulting to true becomes `--no-<name>`,
any other bool `--<name>`. Flags default to "not given" (argparse.SUPPRESS), so the settings model,
not argparse, fills in defaults: `given_settings(args, Model)` returns only what was typed.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# The training loop's short flags, the same in `berth finetune`, `berth sweep` and `berth pretrain`.
LOOP_FLAG_NAMES = {"learning_rate": "--lr", "grad_accum_steps": "--grad-accum", "num_threads": "--threads"}
# Short names a config file or a sweep grid may use for a setting: the loop's flags without their dashes
# (lr, grad_accum, threads), and a grid's shorthands.
SHORT_NAMES = {flag.removeprefix("--").replace("-", "_"): name for name, flag in LOOP_FLAG_NAMES.items()} | {
    "batch": "batch_size", "bs": "batch_size", "max_length": "max_seq_length"}


def add_settings_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    groups: Mapping[str, Iterable[str]] | None = None,
    names: Mapping[str, str | Sequence[str]] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    exclude: Iterable[str] = (),
    env_prefix: str | None = None,
    rest_title: str = "more settings",
) -> None:
    """Add a flag per field of `model` (but `exclude`), in `groups` (title -> field names, in order);
    fields in no group go to a last group titled `rest_title`. `names` replaces a field's flag names;
    `options` adds or replaces argparse keyword arguments (e.g. nargs, choices, or positional=True;
    aliases=[...]: old flag names still accepted but not shown in --help)."""
    names, options = names or {}, options or {}
    fields = {name: field for name, field in model.model_fields.items() if name not in set(exclude)}
    grouped: dict[str, list[str]] = {title: [n for n in members if n in fields]
                                     for title, members in (groups or {}).items()}
    placed = {n for members in grouped.values() for n in members}
    rest = [n for n in fields if n not in placed]
    if rest:
        grouped[rest_title] = rest
    for title, members in grouped.items():
        group = parser.add_argument_group(title)
        for name in members:
            _add_flag(group, name, fields[name], names.get(name), dict(options.get(name, {})), env_prefix)


def given_settings(args: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The settings typed on the command line (flags not given are absent, not None)."""
    return {name: value for name, value in vars(args).items() if name in model.model_fields}


def default_text(field: FieldInfo) -> str | None:
    """How a field's default reads in --help; None when there is none to show."""
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return None
    else:
        value = field.default
    if value is None or value == [] or isinstance(value, bool):
        return None
    if isinstance(value, list):  # as typed on the command line
        return ",".join(map(str, value))
    return str(value)


def _add_flag(group, name: str, field: FieldInfo, flag_names: str | Sequence[str] | None, kwargs: dict[str, Any],
              env_prefix: str | None) -> None:
    kind, choices = _value_type(field.annotation)
    required = field.is_required()
    positional = kwargs.pop("positional", False)
    aliases = kwargs.pop("aliases", ())  # old spellings: still accepted, not shown in --help
    if kind is bool:
        flags = _flags(name, flag_names, "no-" if field.default is True else "")
        kwargs.setdefault("action", "store_false" if field.default is True else "store_true")
    elif "action" in kwargs:  # e.g. store_const: the command says what the flag stores
        flags = _flags(name, flag_names, "")
    else:
        flags = _flags(name, flag_names, "")
        kwargs.setdefault("type", _comma_list if kind is list else kind)
        if kind is list and not positional:
            kwargs.setdefault("metavar", "A,B,...")
        if choices:
            kwargs.setdefault("choices", choices)
        if required and not positional:
            kwargs.setdefault("required", True)
    help_text = kwargs.pop("help", None)
    if help_text is None:
        help_text = field.description or name.replace("_", " ")
        if kwargs.get("action") == "store_false":
            help_text = "turn off (on by default): " + help_text
    shown = default_text(field)
    extras = [f"default: {shown}"] if shown is not None and kind is not bool and "const" not in kwargs else []
    if env_prefix:
        extras.append(env_prefix + name.upper())
    if extras:
        help_text += f" ({'; '.join(extras)})"
    kwargs["help"] = help_text.replace("%", "%%")
    if positional:
        kwargs.setdefault("metavar", name.upper())
        if not required:
            kwargs.setdefault("default", argparse.SUPPRESS)
        group.add_argument(name, **kwargs)
    else:
        group.add_argument(*flags, dest=name, default=argparse.SUPPRESS, **kwargs)
        hidden = {**kwargs, "help": argparse.SUPPRESS, "required": False}
        for alias in aliases:
            group.add_argument(alias, dest=name, default=argparse.SUPPRESS, **hidden)


def _flags(name: str, given: str | Sequence[str] | None, prefix: str) -> list[str]:
    if given:
        return [given] if isinstance(given, str) else list(given)
    return [f"--{prefix}{name.replace('_', '-')}"]


def _value_type(annotation: Any) -> tuple[type, list | None]:
    """(the flag's value type, its choices) of a field annotation; Optional[X] is X."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return _value_type(args[0]) if len(args) == 1 else (str, None)
    if origin is Literal:
        return type(args[0]), list(args)
    if origin is list:
        return list, None
    if annotation in (bool, int, float, str, Path):
        return annotation, None
    return str, None  # e.g. SecretStr: pydantic converts the text


def _comma_list(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]
