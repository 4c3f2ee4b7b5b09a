"""The `berth` command: one entry point, one subcommand per job.

Each subcommand lives beside the code it drives, in a module with
`add_parser(subparsers) -> argparse.ArgumentParser` that sets `func` (a callable taking the parsed
args and returning an exit code). Modules import torch only inside `func`, so `berth --help` and
`berth serve` work in a serving install without torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from berth import __version__

# In the order they appear in `berth --help`.
SUBCOMMAND_MODULES = [
    "training.tokenizer_cli",
    "training.pretrain_cli",
    "training.finetune_cli",
    "training.plot_cli",
    "export.cli",
    "training.build_defaults",
    "service.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="berth",
        description="BERT heads, trained, exported and served. Run `berth <command> --help` for details.",
    )
    parser.add_argument("--version", action="version", version=f"berth {__version__}")
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
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
