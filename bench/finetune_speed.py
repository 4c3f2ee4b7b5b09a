"""Fine-tuning speed: examples/s and real tokens/s before and after each of issue 11's changes.

One run, side by side (GUIDE.md §4), on real data with the default base (all-MiniLM-L6-v2):
SST-2 sentences at max length 64 and SQuAD v1.1 windows of 256 and 384 tokens (doc stride 128),
featurized by the same code `berth finetune` uses. The variants, cumulative:

1. ``random-1thread``: the old loop: random batch order, one intra-op thread, eager PyTorch;
2. ``grouped-1thread``: + length-grouped batches (training.trainer's group_by_length);
3. ``grouped-allcores``: + every usable core (training.threads.default_threads);
4. ``grouped-allcores-compile`` (with ``--compile``): + ``torch.compile(dynamic=True)``.

Each variant trains the same examples (one epoch over a fixed sample, its batches ordered as the
trainer would order them) with a full training step: forward, backward, clip to 1, AdamW, zero_grad.
One untimed warm-up batch per variant (the compile happens there); then the variants take turns
over the repetitions, the order reversed every repetition, so that the other users' load falls on
all of them alike. Reported: medians over repetitions, and the median per-repetition ratio to
variant 1. "real tokens" count attention-mask ones; "padded" is what the model computed on.

    python -m bench.finetune_speed [--compile] [--repetitions 3]

Writes ``bench/results/finetune_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.machine import machine_facts
from training.trainer import TrainSettings, build_optimizer, epoch_batches

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "bench" / "results" / "finetune_speed.json"
VARIANTS = ("random-1thread", "grouped-1thread", "grouped-allcores", "grouped-allcores-compile")


def workloads(sst2_examples: int, squad_questions: int) -> dict[str, dict[str, Any]]:
    """name -> head, features, batch size: real data through the fine-tuning feature code."""
    from tasks.tokenizer import load_tokenizer
    from training import task_data
    from training.checkpoint import default_base_path
    from training.finetune import FinetuneSettings

    base = default_base_path()
    tokenizer = load_tokenizer(base)
    out: dict[str, dict[str, Any]] = {}
    sst2 = FinetuneSettings(task="classification", train_file=DATA / "sst2" / "train.tsv", out=Path("unused"),
                            max_seq_length=64)
    adapter = task_data.adapter_for(sst2, tokenizer)
    examples = adapter.read(sst2.train_file, limit=sst2_examples, seed=0)
    out["SST-2 len 64"] = {"task": "classification", "batch_size": 32,
                           "features": adapter.features(examples, adapter.spec(examples))}
    squad_file = DATA / "squad" / "v1.1" / "train-v1.1-subset-44articles.json"
    for length in (256, 384):
        squad = FinetuneSettings(task="qa", train_file=squad_file, out=Path("unused"), max_seq_length=length,
                                 doc_stride=128)
        adapter = task_data.adapter_for(squad, tokenizer)
        examples = adapter.read(squad_file, limit=squad_questions, seed=0)
        out[f"SQuAD windows {length}"] = {"task": "qa", "batch_size": 8,
                                          "features": adapter.features(examples, adapter.spec(examples))}
    return out


def make_model(task: str) -> torch.nn.Module:
    from training import model as models
    from training.checkpoint import default_base_path, load_pretrained
    from training.finetune import default_pooling

    torch.manual_seed(0)
    if task == "qa":
        model, _ = load_pretrained(models.BertForQuestionAnswering, default_base_path())
    else:
        model, _ = load_pretrained(models.BertForSequenceClassification, default_base_path(),
                                   classifier_pooling=default_pooling(default_base_path()))
    return model.train()


class Contestant:
    def __init__(self, variant: str, task: str, features: list, batch_size: int, all_cores: int) -> None:
        from training import task_data

        self.variant = variant
        self.threads = 1 if variant.endswith("1thread") else all_cores
        grouped = variant.startswith("grouped")
        settings = TrainSettings(output_dir="unused", batch_size=batch_size, seed=0, group_by_length=grouped)
        lengths = [len(f) for f in features]
        self.batches = [task_data.collate([features[i] for i in b])
                        for b in epoch_batches(len(features), settings, 0, lengths=lengths)]
        self.model = make_model(task)
        self.optimizer = build_optimizer(self.model, settings, torch.device("cpu"))
        self.forward = self.model
        if variant.endswith("compile"):
            self.forward = torch.compile(self.model, dynamic=True)
        self.real_tokens = sum(int(b["attention_mask"].sum()) for b in self.batches)
        self.padded_tokens = sum(int(b["input_ids"].numel()) for b in self.batches)
        self.examples = sum(int(b["input_ids"].shape[0]) for b in self.batches)

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        loss = self.forward(**batch)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def epoch_seconds(self) -> float:
        torch.set_num_threads(self.threads)
        started = time.perf_counter()
        for batch in self.batches:
            self.step(batch)
        return time.perf_counter() - started


def benchmark(name: str, work: dict[str, Any], variants: list[str], repetitions: int, all_cores: int) -> dict:
    contestants = [Contestant(v, work["task"], work["features"], work["batch_size"], all_cores) for v in variants]
    warmup: dict[str, float] = {}
    for c in contestants:
        torch.set_num_threads(c.threads)
        started = time.perf_counter()
        c.step(c.batches[0])  # untimed: allocations, and for compile the compilation
        warmup[c.variant] = time.perf_counter() - started
    seconds: dict[str, list[float]] = {c.variant: [] for c in contestants}
    for rep in range(repetitions):
        for c in contestants if rep % 2 == 0 else contestants[::-1]:
            seconds[c.variant].append(c.epoch_seconds())
            print(f"  {name} rep {rep + 1} {c.variant}: {seconds[c.variant][-1]:.1f} s", flush=True)
    first = contestants[0].variant
    result = {"workload": name, "examples": contestants[0].examples, "batch_size": work["batch_size"], "variants": {}}
    for c in contestants:
        s = seconds[c.variant]
        result["variants"][c.variant] = {
            "threads": c.threads,
            "warmup_step_seconds": warmup[c.variant],
            "epoch_seconds": s,
            "examples_per_s": c.examples / statistics.median(s),
            "real_tokens_per_s": c.real_tokens / statistics.median(s),
            "padded_over_real_tokens": c.padded_tokens / c.real_tokens,
            "speedup_vs_first": statistics.median([a / b for a, b in zip(seconds[first], s)]),
        }
    return result


def print_table(results: list[dict]) -> None:
    print(f"{'workload':<22}{'variant':<28}{'thr':>4}{'padded/real':>12}{'examples/s':>12}{'real tok/s':>12}{'speedup':>9}")
    for r in results:
        for i, (variant, v) in enumerate(r["variants"].items()):
            label = r["workload"] if i == 0 else ""
            print(f"{label:<22}{variant:<28}{v['threads']:>4}{v['padded_over_real_tokens']:>12.2f}"
                  f"{v['examples_per_s']:>12.1f}{v['real_tokens_per_s']:>12.0f}{v['speedup_vs_first']:>8.2f}x")


def markdown_table(results: list[dict]) -> str:
    lines = ["| workload | variant | threads | padded / real tokens | examples/s | real tokens/s | speed-up |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        for variant, v in r["variants"].items():
            lines.append(f"| {r['workload']} | {variant} | {v['threads']} | {v['padded_over_real_tokens']:.2f} | "
                         f"{v['examples_per_s']:.1f} | {v['real_tokens_per_s']:.0f} | {v['speedup_vs_first']:.2f}x |")
    return "\n".join(lines)


def padding_of_whole_sets(output: Path) -> None:
    """Padded / real tokens of one epoch over the *whole* training sets, random vs length-grouped order
    (batch 32, the trainer's own batch order; no timing, so the machine's load does not matter)."""
    from tasks.cpu import usable_cpus as usable_cores

    rows = []
    for name, work in workloads(10**9, 10**9).items():
        lengths = [len(f) for f in work["features"]]
        entry = {"workload": name, "examples": len(lengths), "real_tokens": sum(lengths)}
        for grouped in (False, True):
            settings = TrainSettings(output_dir="unused", batch_size=32, seed=0, group_by_length=grouped)
            batches = epoch_batches(len(lengths), settings, 0, lengths=lengths)
            padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
            entry["grouped" if grouped else "random"] = padded / entry["real_tokens"]
        rows.append(entry)
        print(f"{name:<22}{entry['examples']:>8}  padded/real random {entry['random']:.2f}  grouped {entry['grouped']:.2f}",
              flush=True)
    table = ["| training set (all of it) | examples | padded / real tokens, random order | length-grouped |",
             "|---|---:|---:|---:|"]
    table += [f"| {r['workload']} | {r['examples']:,} | {r['random']:.2f} | {r['grouped']:.2f} |" for r in rows]
    output.write_text(json.dumps({"machine": machine_facts(usable_cores()), "batch_size": 32, "results": rows,
                                  "markdown": "\n".join(table)}, indent=2) + "\n")
    print(f"wrote {output}")


def main(argv: list[str] | None = None) -> None:
    from tasks.cpu import usable_cpus as usable_cores

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compile", action="store_true", help="also the torch.compile variant")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--sst2-examples", type=int, default=256, help="SST-2 sentences per epoch (8 batches)")
    parser.add_argument("--squad-questions", type=int, default=48, help="SQuAD questions (their windows)")
    parser.add_argument("--only", nargs="+", help="workload names to run (prefix match)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--padding-only", action="store_true",
                        help="only padded/real tokens over the whole training sets (no timing) -> "
                             "bench/results/finetune_padding.json")
    args = parser.parse_args(argv)
    if args.padding_only:
        return padding_of_whole_sets(RESULTS.with_name("finetune_padding.json"))

    all_cores = usable_cores()  # every core, whatever the load (the trainer's default also looks at the load)
    variants = list(VARIANTS if args.compile else VARIANTS[:3])
    settings = {"variants": variants, "repetitions": args.repetitions, "sst2_examples": args.sst2_examples,
                "squad_questions": args.squad_questions, "all_cores": all_cores,
                "step": "fp32 forward + backward + clip_grad_norm_(1.0) + fused AdamW step + zero_grad"}
    print("settings:", json.dumps(settings), flush=True)
    machine = machine_facts(all_cores)
    results = []
    for name, work in workloads(args.sst2_examples, args.squad_questions).items():
        if args.only and not any(name.startswith(prefix) for prefix in args.only):
            continue
        results.append(benchmark(name, work, variants, args.repetitions, all_cores))
    print()
    print_table(results)
    machine["load_average_after"] = machine_facts()["load_average"]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"machine": machine, "settings": settings, "results": results,
                                       "markdown": markdown_table(results)}, indent=2) + "\n")
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
