"""Every default model that `berth build-defaults` builds gets example inputs that fit its task's route."""

from __future__ import annotations

import json

from berth.build_defaults import EMBEDDINGS_BUNDLE, EXAMPLES, SAMPLE_RECIPES, SHARED_RECIPES
from tasks.bundle_checks import check_examples


def test_every_default_model_has_valid_examples():
    examples = json.loads(EXAMPLES.read_text(encoding="utf-8"))
    defaults = [(r.name, r.task) for r in SAMPLE_RECIPES + SHARED_RECIPES] + [(EMBEDDINGS_BUNDLE, "embedding")]
    for name, task in defaults:
        assert examples.get(name), f"{EXAMPLES} has no examples for the default model {name}"
        check_examples(task, examples[name])
