"""What one save of the resumable training state costs, and so what saving every minute costs a run.

The state `berth finetune` saves (training/loop/trainer.py `_save`): the weights, AdamW's two moments, schedule, scaler
and random states. This builds it for the default base's classification head after one optimizer step and writes
it with training/loop/training_state.save_training_state (atomic: a temporary folder, then a rename) a few times.

    python -m bench.save_cost [--repeats 3] [--folder DIR]

Writes ``bench/results/save_cost.json``. The folder defaults to a temporary one on the disk the runs write to.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.machine import machine_facts

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "save_cost.json"
DEFAULT_INTERVAL_MINUTES = 1.0  # FinetuneSettings.save_every_minutes


def main(argv: list[str] | None = None) -> None:
    from training.bert.checkpoint import default_base_path, load_pretrained
    from training.bert.model import BertForSequenceClassification
    from training.loop.optimizer import build_optimizer
    from training.loop.random_state import capture_rng_state
    from training.loop.settings import TrainSettings
    from training.loop.threads import default_threads
    from training.loop.training_state import STATE_FILE, save_training_state

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=None, help="where to write (default: a temporary folder "
                        "under bench/results, the disk runs write to)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    threads = default_threads()
    torch.set_num_threads(threads)
    model, _ = load_pretrained(BertForSequenceClassification, default_base_path(), num_labels=4,
                               classifier_pooling="mean")
    settings = TrainSettings(output_dir=Path("unused"))
    optimizer = build_optimizer(model, settings, torch.device("cpu"))
    ids = torch.randint(1000, 2000, (8, 32))
    model.train()(ids, torch.ones_like(ids), torch.zeros_like(ids), labels=torch.zeros(8, dtype=torch.long))[
        "loss"].backward()
    optimizer.step()  # the moments exist from here on
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": [capture_rng_state()],
             "step": 1}
    seconds, size = [], 0
    parent = args.folder or REPO / "bench" / "results"
    with tempfile.TemporaryDirectory(dir=parent, prefix=".save-cost-") as tmp:
        for n in range(args.repeats):
            folder = Path(tmp) / f"step-{n:08d}"
            started = time.perf_counter()
            save_training_state(folder, state)
            seconds.append(time.perf_counter() - started)
            size = (folder / STATE_FILE).stat().st_size
    median = statistics.median(seconds)
    record = {"machine": machine_facts(threads), "model": "default base, classification head (mean pooling)",
              "state_bytes": size, "save_seconds": [round(s, 3) for s in seconds], "median_seconds": round(median, 3),
              "interval_minutes": DEFAULT_INTERVAL_MINUTES,
              "share_of_training_time": round(median / (DEFAULT_INTERVAL_MINUTES * 60), 4)}
    print(f"training state {size / 2**20:.0f} MiB: save {median:.2f} s (median of {args.repeats}); every "
          f"{DEFAULT_INTERVAL_MINUTES:g} min of training that is {100 * record['share_of_training_time']:.1f}% of it")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
