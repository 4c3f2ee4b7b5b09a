"""The `berth` command: one entry point, one subcommand per job.

Each subcommand is a module of berth/commands with `add_parser(subparsers)` that sets `func` (a
callable taking the parsed args and returning an exit code). Flags come from the command's settings
model (berth/flags.py). Modules import torch only inside `func`, so `berth --help` and `berth serve`
work in a serving install without torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from tasks.runtime.version import berth_version

# In the order they appear in `berth --help`.
SUBCOMMAND_MODULES = [
    "berth.commands.tokenizer",
    "berth.commands.pretrain",
    "berth.commands.finetune",  # finetune and evaluate
    "berth.commands.sweep",
    "berth.commands.plot",
    "berth.commands.export",
    "berth.commands.sign_bundle",
    "berth.commands.build_defaults",
    "berth.commands.serve",
    "berth.commands.predict",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="berth",
        description="BERT heads, trained, exported and served. Run `berth <command> --help` for details.",
    )
    parser.add_argument("--version", action="version", version=f"berth {berth_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except Exception as error:  # noqa: BLE001 - only the user's errors are caught, the rest re-raised
        if not _is_user_error(error) or os.environ.get("BERTH_DEBUG"):
            raise
        print(f"berth {args.command}: {error}", file=sys.stderr, flush=True)
        return 2


def _is_user_error(error: BaseException) -> bool:
    """An error the user can fix (training.errors.UserFacingError), told in one line; without torch installed
    (a serving install) there is none."""
    try:
        from training.errors import UserFacingError
    except ImportError:
        return False
    return isinstance(error, UserFacingError)


if __name__ == "__main__":
    sys.exit(main())
