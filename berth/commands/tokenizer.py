"""`berth tokenizer`: train a WordPiece vocabulary from raw text files."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _text_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        files.extend(sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p])
    if not files:
        raise SystemExit("no input files found")
    return files


def run(args: argparse.Namespace) -> int:
    from tasks.runtime.tokenizer import save_tokenizer, train_wordpiece

    files = _text_files(args.inputs)
    tok = train_wordpiece(files, vocab_size=args.vocab_size, lowercase=not args.cased,
                          min_frequency=args.min_frequency)
    save_tokenizer(tok, args.out, lowercase=not args.cased)
    print(f"trained a {tok.get_vocab_size()}-token WordPiece vocabulary on {len(files)} files -> {args.out}",
          file=sys.stderr)
    print(json.dumps({"out": str(args.out), "vocab_size": tok.get_vocab_size(), "files": len(files)}))
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "tokenizer",
        help="train a WordPiece vocabulary from raw text",
        description="Train a BERT WordPiece vocabulary (special tokens [PAD] [UNK] [CLS] [SEP] [MASK]) "
        "from text files or folders of text files. Writes tokenizer.json, vocab.txt and "
        "tokenizer_config.json into --out.",
    )
    p.add_argument("inputs", nargs="+", help="text files or folders (searched recursively)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--vocab-size", type=int, default=30522, help="vocabulary size (default: %(default)s)")
    p.add_argument("--min-frequency", type=int, default=2, help="minimum pair frequency (default: %(default)s)")
    p.add_argument("--cased", action="store_true",
                   help="keep case and accents (default: uncased, as bert-base-uncased)")
    p.set_defaults(func=run)
    return p
