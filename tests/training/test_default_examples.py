"""Every default model that `berth build-defaults` builds gets example inputs that fit its task's route."""

from __future__ import annotations

import json

from tasks.bundle import check_examples
from training.build_defaults import EXAMPLES, SAMPLE_RECIPES, SHARED_RECIPES


def test_every_default_recipe_has_valid_examples():
    examples = json.loads(EXAMPLES.read_text(encoding="utf-8"))
    for recipe in SAMPLE_RECIPES + SHARED_RECIPES:
        assert examples.get(recipe.name), f"{EXAMPLES} has no examples for the default model {recipe.name}"
        check_examples(recipe.task, examples[recipe.name])
