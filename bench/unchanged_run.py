"""Does a good fine-tuning run produce the same model from two source trees? The same `berth finetune` command,
run from each tree in turn (PYTHONPATH and working directory set to it), compared on what it produced: the
sha256 of model.safetensors, the logged losses, the dev metrics, and its speed.

    git archive <base-commit> | tar -x -C /tmp/base
    python bench/unchanged_run.py --before /tmp/base --out bench/results/failures/unchanged_run.json

Prints a table and writes JSON with the machine facts (bench/machine.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.machine import machine_facts

REPO = Path(__file__).resolve().parents[1]
TOPICS = REPO / "data" / "samples" / "topics"


def finetune(tree: Path, out: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, "-m", "berth.cli", "finetune", "--task", "classification",
               "--train", str(TOPICS / "train.jsonl"), "--dev", str(TOPICS / "dev.jsonl"), "--out", str(out),
               "--max-train-examples", str(args.train_examples), "--max-eval-examples", str(args.dev_examples),
               "--max-steps", str(args.steps), "--batch-size", "16", "--max-seq-length", "64", "--lr", "1e-4",
               "--threads", str(args.threads), "--precision", "fp32", "--no-progress-bar", "--log-every-steps", "1"]
    done = subprocess.run(command, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: exit {done.returncode}\n{done.stderr[-2000:]}")
    run = json.loads((out / "finetune_run.json").read_text(encoding="utf-8"))
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if json.loads(line).get("split") != "eval"]
    return {"tree": str(tree), "command": " ".join(command[1:]),
            "model_sha256": hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest(),
            "dev_metrics": run["dev_metrics"], "losses": losses, "train_minutes": run["train_minutes"],
            "examples_per_s": run["speed"]["examples_per_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the source tree to compare with")
    parser.add_argument("--after", type=Path, default=REPO, help="default: this tree")
    parser.add_argument("--out", type=Path, required=True, help="the JSON record")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--train-examples", type=int, default=640)
    parser.add_argument("--dev-examples", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        runs = {name: finetune(tree.resolve(), Path(scratch) / name, args)
                for name, tree in (("before", args.before), ("after", args.after))}
    before, after = runs["before"], runs["after"]
    record = {"runs": runs, "same_model": before["model_sha256"] == after["model_sha256"],
              "same_losses": before["losses"] == after["losses"],
              "same_dev_metrics": before["dev_metrics"] == after["dev_metrics"],
              "speed_ratio_after_over_before": round(after["examples_per_s"] / before["examples_per_s"], 3),
              "machine": machine_facts(args.threads), "shared_machine": True}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print("| tree | model sha256 | dev accuracy | last loss | examples/s |\n|---|---|---|---|---|")
    for name, run in runs.items():
        print(f"| {name} | {run['model_sha256'][:12]} | {run['dev_metrics'].get('accuracy')} | {run['losses'][-1]:.6f} "
              f"| {run['examples_per_s']:.1f} |")
    print({k: record[k] for k in ("same_model", "same_losses", "same_dev_metrics", "speed_ratio_after_over_before")})


if __name__ == "__main__":
    main()
