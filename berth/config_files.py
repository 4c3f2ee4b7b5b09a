"""Recipes as files: `--config FILE` (YAML or JSON) for any command whose flags come from a settings model.

A config file is a mapping of the settings model's field names (`learning_rate`, `num_threads`, not the
flags' short names) to values. Precedence, lowest first: the model's defaults, the file, then the flags
typed. Relative paths in a file are read relative to the working directory, as flags are.
`write_config` writes a run's effective settings as YAML, which `--config` reads back unchanged.

Any problem (an unreadable file, a field the model does not have, a value of the wrong type, a
missing required setting) is one line on stderr naming it, and exit code 2, before any work starts.

pydantic-settings is not used: its CLI source would replace argparse and the generated flags
(berth/flags.py: per-command short names, groups, hidden old spellings), and its file sources need the
settings to be `BaseSettings`, while these models are plain pydantic models that the library API takes
as they are (`run_finetune(FinetuneSettings(...))`). Reading the file is `yaml.safe_load` and the
model's own validation (extra="forbid" rejects unknown fields).

Use in a command:
    add_config_flag(parser)                        # after add_settings_flags(...)
    settings = settings_from_args(args, Model, "finetune")
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from berth.flags import SHORT_NAMES, given_settings

CONFIG_FILE = "config.yaml"  # the effective settings of a run, in its output folder
Settings = TypeVar("Settings", bound=BaseModel)


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    """`--config FILE`, and every required flag made optional (the file may hold it; the model checks)."""
    for action in parser._actions:
        if action.required and action.option_strings:
            action.required = False
        elif not action.option_strings and action.dest != "help" and action.nargs is None:
            action.nargs, action.default = "?", argparse.SUPPRESS  # a required positional
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="read settings from this YAML or JSON file (field names as in the settings, e.g. "
                             f"an earlier run's {CONFIG_FILE}); flags given override it")


def read_config(path: Path) -> dict[str, Any]:
    """The mapping in a YAML or JSON file; ConfigError when it cannot be read or is not a mapping."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read config {path}: {getattr(error, 'strerror', None) or error}") from None
    try:
        values = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"config {path} is not valid YAML/JSON{where}: {getattr(error, 'problem', error)}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"config {path} must be a mapping of setting names to values, not a "
                          f"{type(values).__name__}")
    return values


def settings_from_args(args: argparse.Namespace, model: type[Settings], command: str,
                       base: Mapping[str, Any] | None = None) -> Settings:
    """`model` from its defaults, `base`, the `--config` file (if given), then the flags typed; any problem
    exits with one line naming it and code 2."""
    try:
        return merged_settings(model, getattr(args, "config", None), given_settings(args, model), base)
    except ConfigError as error:
        fail(command, str(error))


def merged_settings(model: type[Settings], config: Path | None, flags: Mapping[str, Any],
                    base: Mapping[str, Any] | None = None, sections: dict[str, Any] | None = None,
                    env_prefix: str | None = None) -> Settings:
    """defaults < base < config file < flags, validated; ConfigError with one line on any problem. The keys of
    `sections` are parts of the file that are not settings (a sweep's `grid:`): their values are moved there.
    With `env_prefix` (the service's BERTH_), its variables rank between the file and the flags (the model's
    `from_env` reads them)."""
    from_file = read_config(config) if config else {}
    for key in sections or {}:
        if key in from_file:
            sections[key] = from_file.pop(key)
    if env_prefix is not None:
        from_file = {k: v for k, v in from_file.items() if env_prefix + str(k).upper() not in os.environ}
    values = {**(base or {}), **from_file, **flags}
    try:
        return model.from_env(**values) if env_prefix is not None else model(**values)
    except ValidationError as error:
        raise ConfigError(describe_errors(error, from_file, config, model.model_fields)) from None


def did_you_mean(name: str, fields: list[str]) -> str | None:
    """The setting an unknown name most likely means: the field a flag's short name stands for (lr ->
    learning_rate), else the closest spelling among `fields`."""
    import difflib

    key = name.replace("-", "_").lstrip("_")
    if SHORT_NAMES.get(key) in fields:
        return SHORT_NAMES[key]
    close = difflib.get_close_matches(key, fields, n=1, cutoff=0.75)
    return close[0] if close else None


def describe_errors(error: ValidationError, from_file: Mapping[str, Any], config: Path | None,
                    fields: Iterable[str] = ()) -> str:
    """A ValidationError as one line: each problem with the setting it is about and where it came from; an
    unknown name with the setting it most likely means (a flag's short name, or a close spelling of `fields`)."""
    problems = []
    for item in error.errors():
        name = ".".join(str(part) for part in item["loc"])
        origin = f" in {config}" if config and item["loc"] and item["loc"][0] in from_file else ""
        if item["type"] == "extra_forbidden":
            meant = did_you_mean(name, list(fields))
            problems.append(f"unknown setting {name!r}{origin}" + (f" (did you mean {meant!r}?)" if meant else ""))
        elif item["type"] == "missing":
            problems.append(f"missing setting {name!r} (a flag or a field of --config)")
        elif name:
            problems.append(f"{name}{origin}: {item['msg']} (got {item.get('input')!r})")
        else:
            problems.append(item["msg"].removeprefix("Value error, "))
    return "invalid settings: " + "; ".join(problems)


def config_text(settings: BaseModel, command: str, path: Path | str = CONFIG_FILE) -> str:
    """The settings as the YAML `--config` reads back, after a comment saying what made it."""
    values = settings.model_dump(mode="json")
    head = (f"# berth {command}: the effective settings of this run (defaults, config file and flags merged).\n"
            f"# Run it again: berth {command} --config {path} [--out OTHER]\n")
    return head + yaml.safe_dump(values, sort_keys=False, allow_unicode=True)


def write_config(settings: BaseModel, folder: Path, command: str) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CONFIG_FILE
    path.write_text(config_text(settings, command, path), encoding="utf-8")
    return path


class ConfigError(ValueError):
    """A config file or settings problem, said in one line."""


def fail(command: str, message: str) -> NoReturn:
    print(f"berth {command}: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)
