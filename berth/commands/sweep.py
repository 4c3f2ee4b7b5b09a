"""`berth sweep`: the BERT paper's fine-tuning protocol (a grid x restarts, chosen on dev) as one command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from berth.commands.finetune import FLAG_NAMES, GROUPS, OPTIONS
from berth.flags import add_settings_flags, given_settings
from training.finetuning.settings import FinetuneSettings

DEFAULT_MAX_TRIALS = 48

EXAMPLES = """examples:
  # $DATA: your data folder, laid out as docs/data.md says (where each public set comes from, its license)
  # the paper's GLUE protocol on MRPC: lr among 5e-5/4e-5/3e-5/2e-5, batch 32, 3 epochs, 3 restarts each
  berth sweep --task pair --train $DATA/mrpc/train.tsv --dev $DATA/mrpc/dev.tsv \\
      --out runs/mrpc-sweep --grid paper-glue --restarts 3
  # an explicit grid (18 cells: the paper's appendix recommendation, also `--grid paper`)
  berth sweep --task classification --train $DATA/sst2/train.tsv --dev $DATA/sst2/dev.tsv \\
      --out runs/sst2-sweep --grid lr=5e-5,3e-5,2e-5 batch_size=16,32 epochs=2,3,4 --yes
  # a preset with one key replaced, at most 60 minutes of trials
  berth sweep ... --grid small-bert lr=1e-4,5e-5 --sweep-minutes 60
  # best of three seeds of one recipe (a one-cell grid; `berth build-defaults --data-dir` runs MRPC's
  # restarts this way, into WORK/mrpc-seeds, and copies the sweep.json beside the kept model in WORK/mrpc)
  berth sweep ... --restarts 3

Grid presets: paper (batch {16,32} x lr {5e-5,3e-5,2e-5} x epochs {2,3,4}), paper-glue (batch 32, 3 epochs,
lr {5e-5,4e-5,3e-5,2e-5}), small-bert (batch {8,16,32,64,128} x lr {3e-4,1e-4,5e-5,3e-5}, 4 epochs).
Each epochs value is a run of its own (its own linear decay), not a point of a longer run.

OUT holds sweep.json (every trial, per-cell mean/std/min/max over restarts, the winner), best/ (the
winner's model folder) and trials/<id>/ (each trial's records; weights only for the winner unless
--keep-trials). Kill it and run the same command again: finished trials are not re-run, and a trial
killed mid-way resumes from its own training state (saved every 100 steps unless --save-every-steps).
On a Ray cluster (--ray [ADDRESS]): the same trials through Ray Tune, each the same fine-tuning run, so
the same records and winner as locally; OUT, the data and --base on storage every node sees (any local
path on one machine); --ray-asha stops weak trials early on their dev evaluations (--eval-every-steps).
  berth sweep ... --grid lr=1e-4,5e-5,3e-5 --restarts 3 --threads 2 --ray head:6379
  berth sweep ... --grid lr=1e-4,5e-5,3e-5 --restarts 3 --eval-every-steps 100 --ray --ray-asha
A KubeRay RayJob of it: docker/k8s/rayjob-sweep.yaml.
SQuAD v2: each run chooses its no-answer threshold on dev (recorded per trial).
Restarts: seed s shuffles the data and initialises the head; with --max-train-examples it also draws the
training sample, so the restarts differ in data too. For the paper's restarts (same data), give a fixed
subset file instead.
stdout carries one JSON document (the winner); progress goes to stderr.
"""


class UsageError(ValueError):
    """Bad input, found before any training: one line, exit code 2."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", help="fine-tune over a grid x restarts, keep the best on dev (the BERT paper's protocol)",
        description="Fine-tune once per grid cell and restart (seed), each a real `berth finetune` run, select "
                    "on the dev set by the task's metric, keep the winner's model and write sweep.json with "
                    "every trial and per-cell statistics over restarts.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep = p.add_argument_group("sweep")
    sweep.add_argument("--grid", nargs="+", metavar="ITEM",
                       help="a preset (paper, paper-glue, small-bert) and/or key=v1,v2 items, e.g. lr=5e-5,3e-5 "
                            "batch_size=16,32 epochs=2,3,4; a grid value replaces the setting's flag (default: "
                            "one cell, the fine-tuning settings as given)")
    sweep.add_argument("--restarts", type=int, default=None,
                       help="runs per cell with seeds --seed, --seed+1, ... (default 1)")
    sweep.add_argument("--metric", default=None,
                       help="dev metric to select on, higher is better but for losses and errors (default: "
                            "--metric-for-best if given, else the task's: accuracy, F1, Pearson, SQuAD F1, MRR@10)")
    sweep.add_argument("--sweep-minutes", type=float, default=None,
                       help="no new trial once the trials used this many minutes (counted across resumes); "
                            "--max-minutes is each trial's own budget")
    sweep.add_argument("--max-trials", type=int, default=DEFAULT_MAX_TRIALS,
                       help="refuse a larger sweep (cells x restarts) unless --yes (default: %(default)s)")
    sweep.add_argument("--yes", action="store_true", help="run a sweep larger than --max-trials")
    sweep.add_argument("--keep-trials", action="store_true",
                       help="keep every trial's model folder (default: only the winner's, as OUT/best)")
    sweep.add_argument("--export", type=Path, default=None, metavar="BUNDLE",
                       help="export the winner to this bundle folder (`berth export`, gated as usual)")
    sweep.add_argument("--export-precision", default="fp32", choices=["fp32", "fp16", "int8"],
                       help="precision of the --export bundle (default: %(default)s)")
    sweep.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                       help="run the trials on a Ray cluster through Ray Tune (pip install 'berth[ray]'): ADDRESS "
                            "as ray.init takes it (host:6379, ray://host:10001; without one: RAY_ADDRESS or the "
                            "cluster this node is in). Each trial is the same fine-tuning run as locally, so the "
                            "records and the winner are a local run's for the same seeds; each asks for --threads "
                            "CPUs (default 1). The workers read and write the paths given here: OUT, the data and "
                            "--base must be on storage every node sees at the same paths (on one machine, any "
                            "local path)")
    sweep.add_argument("--ray-asha", action="store_true",
                       help="with --ray: stop weak trials early with Tune's ASHA scheduler on the dev evaluations "
                            "reported while training (needs --eval-every-steps; grace period 1 evaluation, "
                            "reduction factor 4). A stopped trial is recorded as `stopped`, never wins and is not "
                            "re-run")
    sweep.add_argument("--config", type=Path, default=None,
                       help="YAML or JSON file of fine-tuning settings (the flags' names with underscores) and an "
                            "optional `grid:` mapping and `restarts:`; flags override the file")
    optional = {name: {"required": False} for name in ("task", "train_file", "out")}
    add_settings_flags(p, FinetuneSettings, groups=GROUPS, names=FLAG_NAMES,
                       options={**OPTIONS, **optional}, rest_title="training loop (rarely changed)")
    p.set_defaults(func=run_sweep_command)


def build_plan(args: argparse.Namespace):
    """The sweep plan from the flags (and the config file), every cell validated; UsageError if anything is
    wrong, before any training."""
    from berth.config_files import ConfigError, merged_settings
    from berth.sweep.grid import GridError, expand, normalize_grid, parse_grid, size
    from berth.sweep.run import SweepPlan, check_budget

    sections = {"grid": None, "restarts": None}  # a config file's sweep keys, beside the settings
    try:
        settings = merged_settings(FinetuneSettings, args.config, given_settings(args, FinetuneSettings),
                                   sections=sections)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    config_grid, config_restarts = sections["grid"], sections["restarts"]
    if settings.dev_file is None:
        raise UsageError("a sweep selects on dev: give --dev")
    for name in ("train_file", "dev_file"):
        path = getattr(settings, name)
        if not Path(path).exists():
            raise UsageError(f"--{name.removesuffix('_file')} {path}: no such file")
    if args.export is not None:  # the winner's bundle replaces a bundle there, never anything else
        from export.settings import out_refusal

        refused = out_refusal(args.export, force=True, flag="--export")
        if refused:
            raise UsageError(refused)
    try:
        if args.grid is not None:
            grid = parse_grid(args.grid)
        elif config_grid is not None:
            grid = normalize_grid(config_grid)
        else:
            grid = {}
        cells = expand(settings, grid) if grid else [{}]
    except GridError as error:
        raise UsageError(str(error)) from None
    restarts = args.restarts if args.restarts is not None else (config_restarts or 1)
    if not isinstance(restarts, int) or restarts < 1:
        raise UsageError(f"--restarts {restarts}: must be a whole number of at least 1")
    trials = (size(grid) if grid else 1) * restarts
    if trials > args.max_trials and not args.yes:
        raise UsageError(f"{trials} trials ({len(cells)} cells x {restarts} restarts) is more than --max-trials "
                         f"{args.max_trials}; pass --yes to run them")
    if args.max_trials < 1:
        raise UsageError("--max-trials must be at least 1")
    if args.ray is not None and not settings.num_threads:
        settings = settings.model_copy(update={"num_threads": 1})  # a trial's CPUs on the cluster (runtime only)
    plan = SweepPlan(settings=settings, grid=grid, cells=cells, seeds=[settings.seed + r for r in range(restarts)],
                     metric=args.metric, sweep_minutes=args.sweep_minutes, keep_trials=args.keep_trials,
                     command=["berth", *sys.argv[1:]] if Path(sys.argv[0]).name in ("berth", "cli.py") else [])
    try:
        check_budget(plan)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.ray_asha and args.ray is None:
        raise UsageError("--ray-asha schedules the trials of --ray: give --ray too")
    if args.ray_asha and not settings.eval_every_steps:
        raise UsageError("--ray-asha stops trials on the dev evaluations made while training: give --eval-every-steps")
    return plan


def run_sweep_command(args: argparse.Namespace) -> int:
    from berth.sweep.run import SweepError, export_winner, open_sweep, run_sweep

    try:
        plan = build_plan(args)
        open_sweep(plan)  # OUT holds this sweep or none
    except (UsageError, SweepError) as error:
        print(f"berth sweep: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"berth sweep: {len(plan.cells)} cells x {len(plan.seeds)} restarts into {plan.out}", file=sys.stderr)
    try:
        if args.ray is not None:
            from berth.sweep.on_ray import RayUnavailable, run_sweep_on_ray

            try:
                record = run_sweep_on_ray(plan, args.ray, asha=args.ray_asha)
            except RayUnavailable as error:
                print(f"berth sweep: {error}", file=sys.stderr)
                return 2
        else:
            record = run_sweep(plan)
    except SweepError as error:
        print(f"berth sweep: {error}", file=sys.stderr)
        return 2
    result: dict[str, Any] = {
        "out": str(plan.out), "sweep": str(plan.out / "sweep.json"), "metric": record["metric"],
        "winner": record["winner"], "best": str(plan.out / "best") if record["winner"] else None,
        "best_cell_by_mean": record["best_cell_by_mean"], "counts": record["counts"],
        "stopped_by": record["stopped_by"], "minutes": record["minutes"],
    }
    code = 0 if record["winner"] else 1
    if args.export and record["winner"]:
        result["export"] = export_winner(plan, args.export, args.export_precision)
        code = code or (1 if result["export"]["exit_code"] else 0)
    print(json.dumps(result, indent=2))
    return code
