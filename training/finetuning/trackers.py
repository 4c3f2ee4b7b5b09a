"""Experiment trackers for `--report-to`: TensorBoard event files and an MLflow run, as training-loop callbacks.

Each sees every metrics line (`train/loss`, `train/learning_rate`, `train/tokens_per_s` ...) and every dev
evaluation (`dev/<metric>`) by optimizer step; at the end `on_run_end` adds the final dev figures of the saved
model (`final_dev/<metric>`) and, for MLflow, the model folder as the run's artifacts; `close` ends a run that
failed. A resumed run writes
into the same place: TensorBoard hides the events a killed run wrote after the state it resumes from
(`purge_step`); MLflow continues the same run (its id is in the training state) and keeps both values of a
step logged twice.

MLflow: the run goes to MLFLOW_TRACKING_URI when set, else to a file store in ./mlruns (experiment "berth",
or MLFLOW_EXPERIMENT_NAME). mlflow-skinny suffices for both; MLflow 3 keeps its file store in maintenance
mode behind MLFLOW_ALLOW_FILE_STORE, which is set here for that default only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from training.finetuning.settings import FinetuneInputError
from training.loop.callbacks import TrainerCallback

TRACKERS = ("tensorboard", "mlflow")
TENSORBOARD_DIR = "tensorboard"  # under the output folder
DEFAULT_MLFLOW_DIR = "mlruns"  # under the working directory
NOT_LOGGED = {"step", "epoch", "elapsed_s", "split"}


class TrackerUnavailable(FinetuneInputError):
    """A tracker named in --report-to whose package is not installed."""


def check_available(names: Sequence[str]) -> None:
    """Raise TrackerUnavailable, naming the package, when a tracker cannot run here."""
    for name in names:
        if name not in TRACKERS:
            raise TrackerUnavailable(f"--report-to {name}: unknown tracker; choose from {', '.join(TRACKERS)}")
        if importlib.util.find_spec(name) is None:
            package = "mlflow-skinny" if name == "mlflow" else name
            raise TrackerUnavailable(f"--report-to {name}: the {name} package is not installed "
                                     f"(pip install {package}, or berth[track])")


def make_trackers(names: Sequence[str], out: Path, params: dict[str, Any]) -> list[TrainerCallback]:
    """The trackers named, not started yet (they start in `restore`); TrackerUnavailable first if one cannot run."""
    check_available(names)
    made: list[TrainerCallback] = []
    for name in dict.fromkeys(names):
        made.append(TensorBoardTracker(Path(out) / TENSORBOARD_DIR, params) if name == "tensorboard"
                    else MlflowTracker(Path(out).name, params))
    return made


def _scalars(values: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items()
            if k not in NOT_LOGGED and isinstance(v, int | float) and not isinstance(v, bool)}


class TensorBoardTracker(TrainerCallback):
    """Event files in `log_dir` (read them with `tensorboard --logdir OUT`)."""

    name = "tensorboard"

    def __init__(self, log_dir: Path, params: dict[str, Any]) -> None:
        self.log_dir, self.params, self.writer = Path(log_dir), params, None

    def restore(self, state: dict[str, Any] | None, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if state is None:  # a run from scratch: not the curves of an earlier run in the same folder
            shutil.rmtree(self.log_dir, ignore_errors=True)
        self.writer = SummaryWriter(str(self.log_dir), purge_step=None if state is None else step + 1)
        if state is None:
            self.writer.add_text("settings", "```\n" + json.dumps(self.params, indent=2, default=str) + "\n```")

    def state_dict(self) -> dict[str, Any]:
        return {"log_dir": str(self.log_dir)}

    def on_log(self, record: dict[str, Any]) -> None:
        for key, value in _scalars(record).items():
            self.writer.add_scalar(f"train/{key}", value, record["step"])

    def on_evaluate(self, step: int, metrics: dict[str, float], model: nn.Module) -> None:
        for key, value in _scalars(metrics).items():
            self.writer.add_scalar(f"dev/{key}", value, step)
        self.writer.flush()

    def on_run_end(self, out: Path, step: int, dev_metrics: dict[str, float]) -> None:
        if self.writer is not None:
            for key, value in _scalars(dev_metrics).items():
                self.writer.add_scalar(f"final_dev/{key}", value, step)
            self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def mlflow_tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else the file store ./mlruns (allowed explicitly: MLflow 3 keeps it for opt-ins)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return (Path.cwd() / DEFAULT_MLFLOW_DIR).resolve().as_uri()


class MlflowTracker(TrainerCallback):
    """One MLflow run: the settings as params, metrics by step, the model folder as artifacts."""

    name = "mlflow"

    def __init__(self, run_name: str, params: dict[str, Any]) -> None:
        self.run_name, self.params = run_name, params
        self.client, self.run_id = None, None

    def restore(self, state: dict[str, Any] | None, step: int) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(mlflow_tracking_uri())
        if state is not None:
            self.run_id = state["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "berth")
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(experiment_name))
        self.run_id = self.client.create_run(experiment_id, run_name=self.run_name).info.run_id
        params = [Param(key, str(value)[:6000]) for key, value in self.params.items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def _log(self, prefix: str, values: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(f"{prefix}/{key}", value, now, step) for key, value in _scalars(values).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def on_log(self, record: dict[str, Any]) -> None:
        self._log("train", record, record["step"])

    def on_evaluate(self, step: int, metrics: dict[str, float], model: nn.Module) -> None:
        self._log("dev", metrics, step)

    def on_run_end(self, out: Path, step: int, dev_metrics: dict[str, float]) -> None:
        if self.client is None:
            return
        self._log("final_dev", dev_metrics, step)
        self.client.log_artifacts(self.run_id, str(out), artifact_path="model")
        self.client.set_terminated(self.run_id, status="FINISHED")
        self.client = None

    def close(self) -> None:
        """After a failure: the run is marked failed (a resume sets it running again)."""
        if self.client is not None:
            self.client.set_terminated(self.run_id, status="FAILED")
            self.client = None
