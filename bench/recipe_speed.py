"""Seconds per training step of each default recipe (berth/recipes/samples.yaml), and the minutes its
`min_steps` take at that speed: how the recipes' minimums are sized for the slowest CPU.

    python -m bench.recipe_speed [--precision fp32] [--steps 30] [--out bench/results/recipe_speed.json]

To measure as an AVX2-only CPU would run, hold PyTorch's kernels to AVX2 in the environment:

    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 BERTH_CPU_BF16=0 \
        python -m bench.recipe_speed --precision fp32 --out bench/results/defaults_build/recipe_speed-avx2.json

Each recipe trains `--steps` steps on 2 threads without a dev set; the time per step includes the first
(warm-up) step, so it errs slow.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from bench.machine import machine_facts
from bench.recipe_points import fixed_step_settings
from berth.build_defaults import SAMPLE_RECIPES

HELD_TO = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "BERTH_CPU_BF16")


def recipe_speed(precision: str, steps: int, threads: int) -> dict:
    from training.finetuning.finetune import run_finetune

    rows = {}
    with tempfile.TemporaryDirectory() as work:
        for recipe in SAMPLE_RECIPES:
            settings = fixed_step_settings(recipe, steps, Path(work) / recipe.name, threads, dev=False,
                                           precision=precision)
            run_finetune(settings)
            run = json.loads((settings.out / "finetune_run.json").read_text(encoding="utf-8"))
            per_step = run["train_result"]["elapsed_s"] / run["train_result"]["steps"]
            least, budget = recipe.options.get("min_steps") or 0, recipe.options.get("max_minutes")
            rows[recipe.name] = {"s_per_step": round(per_step, 4), "precision": run["precision"],
                                 "threads": run["speed"]["threads"], "min_steps": least, "budget_minutes": budget,
                                 "min_steps_minutes": round(per_step * least / 60, 2),
                                 "steps_in_budget": int(budget * 60 / per_step) if budget else None}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = recipe_speed(args.precision, args.steps, args.threads)
    print("| recipe | s/step | min_steps | their minutes | budget (min) | steps in budget |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['s_per_step']:.3f} | {r['min_steps']} | {r['min_steps_minutes']:.2f} | "
              f"{r['budget_minutes']} | {r['steps_in_budget']} |")
    if args.out:
        record = {"machine": machine_facts(threads=args.threads),
                  "environment": {k: os.environ.get(k) for k in HELD_TO}, "recipes": rows}
        args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
