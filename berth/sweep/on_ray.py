"""`berth sweep --ray`: the trials of a sweep on a Ray cluster through Ray Tune.

Each trial is the same `run_trial` as a local sweep's (berth/sweep/run.py: one `run_finetune` call, its
trial.json written atomically), run inside a Tune trial on whichever node has the CPUs; the driver then
reads the trial records back and writes sweep.json with the local code (winner, statistics, OUT/best).
So the records and the winner are a local run's for the same seeds.

Storage: the workers read the data and the base and write their trial folders at the paths the driver
gives (relative paths from the driver's working directory), so the sweep folder, the data and the base
must be on storage every node sees at the same paths (a shared file system). On one machine a local
path is fine.

Resources: each trial asks Ray for `num_threads` CPUs (1 unless --threads) and trains with that many
threads; Tune runs as many trials at once as the cluster's free CPUs allow.

ASHA (`asha=True`): Tune's asynchronous successive halving stops weak trials early. A trial reports each
dev evaluation of its training loop (--eval-every-steps; the evaluation sample's metrics) to Tune; at each
rung (1, 4, 16 ... evaluations: grace period 1, reduction factor 4, Ray's defaults) a trial under the
best quarter of the trials that reached that rung is stopped. A stopped trial's record says
`status: stopped` with the step and the evaluation it was stopped at; it never wins and is not re-run.

The whole-sweep budget (`sweep_minutes`) is Tune's time budget: trials still running when it is spent
are stopped without a record, so the same command later continues them from their own training state.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from berth.sweep.run import (
    RECORD_FILE,
    TRIAL_FILE,
    TRIALS_DIR,
    SweepError,
    SweepPlan,
    _keep_winner,
    _now,
    _winner,
    _write_json,
    load_trials,
    open_sweep,
    run_trial,
    summarize,
    trial_id,
)
from training.loop.callbacks import TrainerCallback, greater_is_better

log = logging.getLogger("berth.sweep")

OBJECTIVE = "sweep_objective"  # the selection metric, under one name, in every result reported to Tune
STOPPED_FILE = "stopped_early.json"  # in a trial folder: the scheduler's decision, written by the driver
ASHA_GRACE_PERIOD = 1  # evaluations before a trial can be stopped
ASHA_REDUCTION_FACTOR = 4


class RayUnavailable(RuntimeError):
    """ray (with Tune) is not installed: the message says how to install it."""


def _import_ray():
    try:
        import ray
        from ray import tune
    except ImportError as error:
        raise RayUnavailable("berth sweep --ray needs Ray Tune: pip install 'berth[ray]' "
                             f"(ray[data,tune]) ({error})") from None
    return ray, tune


def selection_metric(plan: SweepPlan) -> str | None:
    """The metric asked for (--metric, else --metric-for-best); None: the task's headline metric."""
    return plan.metric or plan.settings.metric_for_best


class TuneReport(TrainerCallback):
    """Reports every dev evaluation of the training loop to Tune (the selection metric as OBJECTIVE)."""

    name = "tune_report"

    def __init__(self, task: str, metric: str | None):
        self.task, self.metric = task, metric

    def on_evaluate(self, step: int, metrics: dict[str, float], model) -> None:
        from ray import tune

        tune.report({**_objective(self.task, self.metric, metrics), "step": step, "final": False,
                     **{f"dev_sample/{key}": value for key, value in metrics.items()}})


def _objective(task: str, metric: str | None, metrics: dict[str, float]) -> dict[str, float]:
    if not metrics:
        return {}
    if metric is None:
        from tasks.registry import definition

        metric = definition(task).headline_metric(metrics)[0]
    value = metrics.get(metric)
    return {OBJECTIVE: float(value)} if isinstance(value, int | float) else {}


def parse_trial_id(key: str) -> tuple[int, int]:
    """(cell, seed) of a trial id (`c03-seed43`)."""
    cell, seed = key.split("-seed", 1)
    return int(cell[1:]), int(seed)


def _trainable(config: dict[str, Any], plan: SweepPlan, cwd: str) -> None:
    """One trial on a Ray worker: the local sweep's run_trial, with the evaluations reported to Tune."""
    from ray import tune

    from training.finetuning.finetune import run_finetune

    if os.path.isdir(cwd):
        os.chdir(cwd)  # the plan's relative paths are the driver's
    cell, seed = parse_trial_id(config["trial"])
    metric = selection_metric(plan)
    runner = functools.partial(run_finetune, callbacks=[TuneReport(plan.settings.task, metric)])
    record = run_trial(plan, cell, seed, runner)  # trial.json is written before the last report
    final = _objective(plan.settings.task, metric, record.get("dev_metrics") or {}) if record["status"] == "ok" else {}
    tune.report({**final, "step": record.get("steps") or 0, "final": True, "trial_status": record["status"]})


def _asha(plan: SweepPlan, mode: str):
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    class RecordingASHA(ASHAScheduler):
        """ASHA that writes its stop decisions into the trial folders (on the driver), so the sweep's record
        tells a stopped trial from a failed one or one not run."""

        def on_trial_result(self, tune_controller, trial, result):
            decision = super().on_trial_result(tune_controller, trial, result)
            if decision == TrialScheduler.STOP and not result.get("final"):
                _write_json(plan.out / TRIALS_DIR / trial.config["trial"] / STOPPED_FILE,
                            {"step": result.get("step"), "evaluations": result.get("training_iteration"),
                             "objective": result.get(OBJECTIVE), "at": _now(),
                             "dev_sample_metrics": {k.removeprefix("dev_sample/"): v for k, v in result.items()
                                                    if k.startswith("dev_sample/")}})
            return decision

    return RecordingASHA(time_attr="training_iteration", metric=OBJECTIVE, mode=mode, max_t=10**6,
                         grace_period=ASHA_GRACE_PERIOD, reduction_factor=ASHA_REDUCTION_FACTOR)


def run_sweep_on_ray(plan: SweepPlan, address: str = "auto", asha: bool = False) -> dict[str, Any]:
    """Run every unfinished trial of `plan` on the Ray cluster at `address` ("auto": RAY_ADDRESS or the
    cluster this node is in) and return the sweep record, as berth.sweep.run.run_sweep does locally."""
    ray, tune = _import_ray()
    open_sweep(plan)
    done = load_trials(plan)
    todo = [(cell, seed) for cell, seed in plan.order() if trial_id(cell, seed) not in done]
    if len(todo) < len(plan.order()):
        log.info("sweep %s: %d of %d trials already finished, not re-run", plan.out, len(plan.order()) - len(todo),
                 len(plan.order()))
    for cell, seed in todo:  # a decision of an earlier, interrupted run does not carry over
        (plan.out / TRIALS_DIR / trial_id(cell, seed) / STOPPED_FILE).unlink(missing_ok=True)
    metric = selection_metric(plan)
    mode = "max" if metric is None or greater_is_better(metric) else "min"
    results = []
    if todo:
        cpus = float(plan.settings.num_threads or 1)
        os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")  # a failed trial reports no metric
        # Tune and the workers' forwarded logs print to stdout; the command's stdout is its one JSON document.
        with contextlib.redirect_stdout(sys.stderr):
            connected_here = not ray.is_initialized()
            if connected_here:
                try:
                    ray.init(address=address, logging_level="WARNING", configure_logging=True)
                except ConnectionError as error:
                    raise SweepError(f"--ray {address}: {str(error).splitlines()[0]}") from None
            try:
                largest = max((node.get("Resources", {}).get("CPU", 0) for node in ray.nodes() if node.get("Alive")),
                              default=0)
                if largest < cpus:  # Tune would wait for it forever
                    raise SweepError(f"no node of the Ray cluster has the {cpus:g} CPUs a trial asks for (--threads); "
                                     f"the largest has {largest:g}")
                trainable = tune.with_resources(tune.with_parameters(_trainable, plan=plan, cwd=os.getcwd()),
                                                {"cpu": cpus})
                tuner = tune.Tuner(
                    trainable,
                    param_space={"trial": tune.grid_search([trial_id(cell, seed) for cell, seed in todo])},
                    tune_config=tune.TuneConfig(
                        scheduler=_asha(plan, mode) if asha else None,
                        time_budget_s=plan.sweep_minutes * 60 if plan.sweep_minutes else None),
                    run_config=tune.RunConfig(name="tune", storage_path=str((plan.out / "ray").resolve()),
                                              verbose=0),
                )
                results = list(tuner.fit())
            finally:
                if connected_here:
                    ray.shutdown()
    for result in results:
        _record_unfinished(plan, result)
    done = load_trials(plan)
    winner = _winner(plan, done)
    _keep_winner(plan, done, winner)
    not_run = any(trial_id(cell, seed) not in done for cell, seed in plan.order())
    record = summarize(plan, done, stopped_by="sweep_minutes" if not_run and plan.sweep_minutes else None)
    record["ray"] = {"address": address, "asha": {"grace_period": ASHA_GRACE_PERIOD,
                                                 "reduction_factor": ASHA_REDUCTION_FACTOR,
                                                 "time_attr": "dev evaluations"} if asha else None}
    _write_json(plan.out / RECORD_FILE, record)
    return record


def _record_unfinished(plan: SweepPlan, result) -> None:
    """A Tune trial that left no trial.json: stopped by ASHA (its decision in the folder) or crashed (the
    worker died, an error outside run_trial) gets a record; one cut by the time budget stays not run."""
    key = result.config["trial"]
    folder = plan.out / TRIALS_DIR / key
    if (folder / TRIAL_FILE).is_file():
        return
    cell, seed = parse_trial_id(key)
    record: dict[str, Any] = {"id": key, "cell": cell, "seed": seed,
                              "settings": json.loads(json.dumps(plan.cells[cell], default=str)),
                              "folder": str(Path(TRIALS_DIR) / key), "dev_metrics": {}, "finished_at": _now(),
                              "minutes": round(float((result.metrics or {}).get("time_total_s") or 0) / 60, 3)}
    stopped = folder / STOPPED_FILE
    if stopped.is_file():
        decision = json.loads(stopped.read_text(encoding="utf-8"))
        record.update(status="stopped", stopped_early={"by": "asha", **decision})
    elif result.error is not None:
        record.update(status="failed", error=f"{type(result.error).__name__}: {result.error}".splitlines()[0][:500])
    else:
        return
    _write_json(folder / TRIAL_FILE, record)
