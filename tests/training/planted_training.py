"""A tiny classifier trained by the real loop while its "dev metric" follows a curve planted by the test; also a script.

The planted evaluation returns CURVE[step] (a function of the optimizer step, so a resumed run sees the same
values) and remembers a hash of the weights it was shown, so a test can tell which step's weights were kept.
As a script (for the SIGKILL tests) it trains with the best-checkpoint and early-stopping callbacks; with
--hang-after-step N the data blocks forever once metrics.jsonl reaches step N, so that the test kills the
process at a known point. At the end it writes result.json: the best record, the early-stopping state, the
stop step and the hash of the best weights. It trains on one thread unless told otherwise (--threads N, or auto:
the trainer's default), since the thread count changes the weights' bits.

    python -m tests.training.planted_training OUT [--hang-after-step N] [--threads N|auto]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from tests.training.tiny_training import LabelledTokens, collate_labelled, state_hash, tiny_classifier
from training.loop.callbacks import BestCheckpoint, EarlyStopping, TrainerCallback
from training.loop.settings import TrainSettings
from training.loop.trainer import train

# Evaluated every 2 steps, saved every 4; patience 3: the best is step 6 (0.70, after the state of step 4),
# then 8, 10 and 12 do not beat it, so the run stops at 12, before the 0.90 of step 14.
CURVE = {2: 0.50, 4: 0.55, 6: 0.70, 8: 0.65, 10: 0.60, 12: 0.60, 14: 0.90, 16: 0.95, 18: 0.95, 20: 0.95}
PATIENCE = 3
SETTINGS = {"max_steps": 20, "batch_size": 4, "eval_every_steps": 2, "save_every_steps": 4, "log_every_steps": 1,
            "learning_rate": 1e-3, "precision": "fp32", "progress_bar": False, "seed": 3}


class PlantedEvaluation:
    def __init__(self, curve: dict[int, float], metric: str = "accuracy") -> None:
        self.curve, self.metric = curve, metric
        self.step = 0
        self.seen: dict[int, str] = {}  # step -> hash of the weights evaluated there

    def advance(self, step: int) -> None:
        self.step = step

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        self.seen[self.step] = state_hash(model)
        return {self.metric: self.curve[self.step]}


class StepWatcher(TrainerCallback):
    """Tells the planted evaluation the step (the loop hands evaluate only the model) by its on_log hook."""

    name = "step_watcher"

    def __init__(self, evaluation: PlantedEvaluation) -> None:
        self.evaluation = evaluation

    def on_log(self, record) -> None:
        self.evaluation.advance(record["step"])


class HangingData(LabelledTokens):
    def __init__(self, metrics: Path, hang_after_step: int | None) -> None:
        super().__init__(size=40)
        self.metrics, self.hang_after_step = metrics, hang_after_step

    def __getitem__(self, index: int):
        if self.hang_after_step is not None and self.metrics.is_file():
            steps = [json.loads(line).get("step", 0) for line in self.metrics.read_text().splitlines() if line.strip()]
            if steps and max(steps) >= self.hang_after_step:
                (self.metrics.parent / "hanging").write_text("")
                while True:
                    time.sleep(60)
        return super().__getitem__(index)


def run(out: Path, hang_after_step: int | None = None, curve: dict[int, float] = CURVE,
        patience: int | None = PATIENCE, metric: str = "accuracy", threads: int | None = 1) -> dict:
    """Train on `threads` (None: the trainer's default); the record as result.json holds it (step keys as
    strings)."""
    evaluation = PlantedEvaluation(curve, metric)
    best = BestCheckpoint(out / "best", metric)  # the direction from the metric's name
    callbacks = [StepWatcher(evaluation), best]
    stopping = EarlyStopping(metric, patience) if patience else None
    if stopping:
        callbacks.append(stopping)
    model = tiny_classifier()
    result = train(model, HangingData(out / "metrics.jsonl", hang_after_step), collate_labelled,
                   TrainSettings(output_dir=out, num_threads=threads, **SETTINGS), evaluate=evaluation,
                   callbacks=callbacks)
    model.load_state_dict(best.best_weights())
    record = {"best": best.record(), "early_stopping": stopping.state_dict() if stopping else None,
              "steps": result.steps, "stopped_by": result.stopped_by, "best_weights": state_hash(model),
              "seen": evaluation.seen}
    (out / "result.json").write_text(json.dumps(record))
    return json.loads(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--hang-after-step", type=int, default=None)
    parser.add_argument("--threads", default="1", help="a count, or auto (unset: the trainer picks)")
    args = parser.parse_args()
    run(args.out, args.hang_after_step, threads=None if args.threads == "auto" else int(args.threads))


if __name__ == "__main__":
    main()
