"""`berth build-defaults`: fine-tune and export the default bundles (the recipes are in berth/build_defaults.py)."""

from __future__ import annotations

import argparse
import logging

from berth.build_defaults import BuildDefaultsSettings
from berth.flags import add_settings_flags, given_settings


def run(args: argparse.Namespace) -> int:
    from berth.build_defaults import EMBEDDINGS_BUNDLE, build_defaults, build_embeddings_bundle

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    s = BuildDefaultsSettings(**given_settings(args, BuildDefaultsSettings))
    if not s.only or EMBEDDINGS_BUNDLE in s.only:
        build_embeddings_bundle(s.out, s.force, s.threads)
    build_defaults(s.out, s.work, s.data_dir, s.only, s.force, s.precision, s.threads, s.minutes_per_model)
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "build-defaults", help="fine-tune and export the default bundles (what `make run` serves)",
        description="Fine-tune the embedded base model for classification (topics), sentence pairs "
                    "(similarity), NER (entities), SQuAD QA (squad) and passage reranking (rerank) on the shipped "
                    "samples in data/samples, "
                    "each within a few minutes, export an ONNX bundle of each into --out, and export the base "
                    "itself as the `embeddings` bundle. Existing bundles are kept unless --force.")
    add_settings_flags(p, BuildDefaultsSettings, rest_title="settings",
                       options={"only": {"nargs": "+", "type": str, "metavar": "NAME"}})
    p.set_defaults(func=run)
    return p
