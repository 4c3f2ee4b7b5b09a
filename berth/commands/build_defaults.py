"""`berth build-defaults`: fine-tune and export the default bundles (the recipes are data: berth/recipes/*.yaml)."""

from __future__ import annotations

import argparse
import json
import logging

from berth.build_defaults import BuildDefaultsSettings
from berth.config_files import ConfigError, add_config_flag, fail, settings_from_args
from berth.flags import add_settings_flags


def run(args: argparse.Namespace) -> int:
    from berth.build_defaults import EMBEDDINGS_BUNDLE, build_defaults, build_embeddings_bundle, load_recipes
    from export.bundle_builder import quiet_optimizer_logs

    # INFO: what each model does (data, schedule, dev metrics) goes to stderr with the progress lines.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_optimizer_logs()
    s = settings_from_args(args, BuildDefaultsSettings, "build-defaults")
    if s.recipes:
        try:
            load_recipes(s.recipes)  # checked before anything is built
        except ConfigError as error:
            fail("build-defaults", str(error))
    built = []
    if not s.only or EMBEDDINGS_BUNDLE in s.only:
        built.append(build_embeddings_bundle(s.out, s.force, s.threads))
    built += build_defaults(s.out, s.work, s.data_dir, s.only, s.force, s.precision, s.threads, s.minutes_per_model,
                            s.recipes)
    print(json.dumps({"out": str(s.out), "built": [str(b) for b in built if b is not None]}, indent=2))
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "build-defaults", help="fine-tune and export the default bundles (what `make run` serves)",
        description="Fine-tune the embedded base model for classification (topics), sentence pairs "
                    "(similarity), NER (entities), SQuAD QA (squad) and passage reranking (rerank) on the shipped "
                    "samples in data/samples, "
                    "each within a few minutes, export an ONNX bundle of each into --out, and export the base "
                    "itself as the `embeddings` bundle. Existing bundles are kept unless --force. The recipes "
                    "are the YAML files in berth/recipes/ (--recipes FILE builds from another). Progress and "
                    "status go to stderr; stdout gets the built bundles as JSON.")
    add_settings_flags(p, BuildDefaultsSettings, rest_title="settings",
                       options={"only": {"nargs": "+", "type": str, "metavar": "NAME"}})
    add_config_flag(p)
    p.set_defaults(func=run)
    return p
