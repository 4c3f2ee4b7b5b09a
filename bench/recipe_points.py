"""Dev metric against training steps for the default recipes (berth/recipes/samples.yaml): each named recipe
trained from the base for each given number of steps (its own options otherwise: batch, learning rate, sequence
length, data; no time budget, no epoch cap, so that the machine's speed or load does not change what is trained),
then scored on its dev set. A point says its examples seen, so bench/minutes_table.py can turn it into minutes at
a reference build's measured speed. Usage, from the repository root:

    python -m bench.recipe_points topics=113,452 entities=342,799 --out bench/results/recipe_points.json

A recipe name may carry a variant after a colon: recipe field overrides from the recipe's fallbacks by number
(`rerank:fallback1`), or another recipe's point as the base instead of the embedded one
(`rerank:from-similarity@160`: the similarity model of 160 steps, trained earlier in the plan or a run before).
Points already in `--out` (same recipe, steps and variant) are kept, not retrained.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from bench.machine import machine_facts
from berth.build_defaults import SAMPLE_RECIPES, Recipe
from tasks.shipped_samples import SAMPLES

RESULTS = Path(__file__).resolve().parent / "results"
BUDGET_OPTIONS = ("max_minutes", "min_steps", "epochs", "max_eval_examples")


def fixed_step_settings(recipe: Recipe, steps: int, out: Path, threads: int, dev: bool, **extra: Any):
    """The recipe's fine-tuning settings for exactly `steps` optimizer steps, without its time budget."""
    from training.finetuning.finetune import FinetuneSettings

    options = {k: v for k, v in recipe.options.items() if k not in BUDGET_OPTIONS}
    return FinetuneSettings(task=recipe.task, train_file=SAMPLES / recipe.train,
                            dev_file=SAMPLES / recipe.dev if dev else None, out=out, num_threads=threads,
                            max_steps=steps, progress_bar=False, **{**options, **extra})


def recipe_variant(spec: str) -> tuple[Recipe, str]:
    name, _, variant = spec.partition(":")
    recipe = next(r for r in SAMPLE_RECIPES if r.name == name)
    if variant.startswith("fallback"):
        fallback = recipe.fallbacks[int(variant.removeprefix("fallback")) - 1]
        recipe = dataclasses.replace(recipe, **{**fallback, "options": {**recipe.options,
                                                                         **fallback.get("options", {})}})
    return recipe, variant or "main"


def base_of(variant: str, work: Path) -> dict[str, str]:
    """The `base` setting of a `from-RECIPE@STEPS` variant: that recipe's point folder (empty for others)."""
    if not variant.startswith("from-"):
        return {}
    name, _, steps = variant.removeprefix("from-").partition("@")
    folder = work / f"{name}-main-{steps}"
    if not (folder / "config.json").is_file():
        raise SystemExit(f"{variant}: no model in {folder}; put {name}={steps} before it in the plan")
    return {"base": str(folder)}


def point(recipe: Recipe, variant: str, steps: int, work: Path, threads: int) -> dict[str, Any]:
    from training.finetuning.finetune import run_finetune

    out = work / f"{recipe.name}-{variant}-{steps}"
    started = time.monotonic()
    if not (out / "finetune_run.json").is_file():  # else a run of these settings made before (or linked there)
        run_finetune(fixed_step_settings(recipe, steps, out, threads, dev=True, **base_of(variant, work)))
    run = json.loads((out / "finetune_run.json").read_text(encoding="utf-8"))
    metrics = run["dev_metrics"]
    metric = recipe.floor[0]
    return {"model": recipe.name, "variant": variant, "train": recipe.train, "dev": recipe.dev, "steps": steps,
            "examples_seen": round(float(run["train_result"]["epochs"]) * run["train_examples"]),
            "metric": metric, "value": metrics[metric], "dev_metrics": metrics, "dev_examples": run["dev_examples"],
            "examples_per_s": round(run["speed"]["examples_per_s"], 2),
            "precision": run["precision"], "threads": run["speed"]["threads"],
            "train_minutes": run["train_minutes"], "wall_minutes": round((time.monotonic() - started) / 60, 2),
            "load_average": machine_facts(threads)["load_average"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("plan", nargs="+", help="RECIPE[:fallbackN]=STEPS,STEPS,...")
    parser.add_argument("--work", type=Path, default=Path("runs/recipe_points"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "recipe_points.json")
    args = parser.parse_args(argv)

    result = (json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file()
              else {"points": [], "machine": machine_facts(args.threads)})
    done = {(p["model"], p["variant"], p["steps"]) for p in result["points"]}
    for entry in args.plan:
        spec, _, steps = entry.partition("=")
        recipe, variant = recipe_variant(spec)
        for count in [int(s) for s in steps.split(",")]:
            if (recipe.name, variant, count) in done:
                continue
            result["points"].append(point(recipe, variant, count, args.work, args.threads))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = ["| model | variant | steps | examples seen | dev metric | examples/s (threads, precision) | load |",
             "|---|---|---|---|---|---|---|"]
    for p in sorted(result["points"], key=lambda p: (p["model"], p["variant"], p["steps"])):
        lines.append(f"| {p['model']} | {p['variant']} | {p['steps']} | {p['examples_seen']:,} | {p['metric']} "
                     f"{p['value']:.4g} | {p['examples_per_s']:g} ({p['threads']}, {p['precision']}) | "
                     f"{p['load_average'][0]:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
