"""Fine-tuning speed: examples/s and real tokens/s of the training step, variants side by side.

One run, side by side, on real data with the default base (all-MiniLM-L6-v2): SST-2 sentences
at max length 64, CoNLL-2003 sentences at 128 (with ``--precision``) and SQuAD v1.1 windows of 256
and 384 tokens (doc stride 128), featurized by the same code `berth finetune` uses.

The default variants, cumulative:

1. ``random-1thread``: the old loop: random batch order, one intra-op thread, eager PyTorch;
2. ``grouped-1thread``: + length-grouped batches (training.loop.trainer's group_by_length);
3. ``grouped-allcores``: + every usable core (training.loop.threads.default_threads);
4. ``grouped-allcores-compile`` (with ``--compile``): + ``torch.compile(dynamic=True)``.

With ``--precision``: ``fp32`` (= grouped-allcores) against ``bf16`` (autocast, as the trainer's
precision=bf16: fp32 weights and AdamW state), and with ``--compile`` ``fp32-compile`` too. Whether
the CPU has native bf16 (AVX-512 BF16 / AMX) is recorded with the machine facts: without it bf16 is
emulated.

Each variant trains the same examples (one epoch over a fixed sample, its batches ordered as the
trainer would order them) with a full training step: forward, backward, clip to 1, AdamW, zero_grad.
One untimed warm-up batch per variant (the compile happens there); then the variants take turns
over the repetitions, the order reversed every repetition, so that the other users' load falls on
all of them alike. Reported: medians over repetitions, and the median per-repetition ratio to
variant 1. "real tokens" count attention-mask ones; "padded" is what the model computed on.

    python -m bench.finetune_speed [--compile] [--repetitions 3]
    python -m bench.finetune_speed --precision [--compile]

Writes ``bench/results/finetune_speed.json`` (``finetune_precision.json`` with ``--precision``).
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
from training.loop.data_order import epoch_batches
from training.loop.optimizer import build_optimizer
from training.loop.precision import autocast, cpu_bf16_support
from training.loop.settings import TrainSettings

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "bench" / "results" / "finetune_speed.json"
VARIANTS = ("random-1thread", "grouped-1thread", "grouped-allcores", "grouped-allcores-compile")
PRECISION_VARIANTS = ("fp32", "bf16", "fp32-compile")


def workloads(sst2_examples: int, squad_questions: int, conll_sentences: int = 0,
              squad_lengths: tuple[int, ...] = (256, 384)) -> dict[str, dict[str, Any]]:
    """name -> spec (which head, as `berth finetune` chooses it), features, batch size: real data through the
    fine-tuning feature code."""
    from tasks.runtime.tokenizer import load_tokenizer
    from training.bert.checkpoint import default_base_path
    from training.finetuning import task_data
    from training.finetuning.finetune import FinetuneSettings

    base = default_base_path()
    tokenizer = load_tokenizer(base)
    out: dict[str, dict[str, Any]] = {}
    sst2 = FinetuneSettings(task="classification", train_file=DATA / "sst2" / "train.tsv", out=Path("unused"),
                            max_seq_length=64)
    adapter = task_data.adapter_for(sst2, tokenizer)
    examples = adapter.read(sst2.train_file, limit=sst2_examples, seed=0)
    spec = adapter.spec(examples)
    out["SST-2 len 64"] = {"spec": spec, "batch_size": 32, "features": adapter.features(examples, spec)}
    if conll_sentences:
        conll = FinetuneSettings(task="ner", train_file=DATA / "conll2003" / "iob2" / "train.txt",
                                 out=Path("unused"), max_seq_length=128)
        adapter = task_data.adapter_for(conll, tokenizer)
        examples = adapter.read(conll.train_file, limit=conll_sentences, seed=0)
        spec = adapter.spec(examples)
        out["CoNLL NER len 128"] = {"spec": spec, "batch_size": 32, "features": adapter.features(examples, spec)}
    squad_file = DATA / "squad" / "v1.1" / "train-v1.1-subset-44articles.json"
    for length in squad_lengths:
        squad = FinetuneSettings(task="qa", train_file=squad_file, out=Path("unused"), max_seq_length=length,
                                 doc_stride=128)
        adapter = task_data.adapter_for(squad, tokenizer)
        examples = adapter.read(squad_file, limit=squad_questions, seed=0)
        spec = adapter.spec(examples)
        out[f"SQuAD windows {length}"] = {"spec": spec, "batch_size": 8, "features": adapter.features(examples, spec)}
    return out


def make_model(spec: Any) -> torch.nn.Module:
    """The head `berth finetune` trains for `spec` on the default base, chosen as it chooses it: the task
    definition's head class and config values (its labels), the base's own pooling where the head pools."""
    from tasks.registry import definition, head_class
    from training.bert import model as models
    from training.bert.checkpoint import default_base_path, load_pretrained
    from training.finetuning.finetune import default_pooling

    torch.manual_seed(0)
    base, task = default_base_path(), definition(spec.task)
    overrides = task.head_overrides(spec)
    if task.pools:
        overrides["classifier_pooling"] = default_pooling(base)
    model, _ = load_pretrained(getattr(models, head_class(spec)), base,
                               **{k: v for k, v in overrides.items() if v is not None})
    return model.train()


class Contestant:
    def __init__(self, variant: str, spec: Any, features: list, batch_size: int, all_cores: int) -> None:
        from training.finetuning import task_data

        self.variant = variant
        self.threads = 1 if variant.endswith("1thread") else all_cores
        grouped = not variant.startswith("random")
        self.dtype = torch.bfloat16 if variant.startswith("bf16") else None
        settings = TrainSettings(output_dir="unused", batch_size=batch_size, seed=0, group_by_length=grouped)
        lengths = [len(f) for f in features]
        self.batches = [task_data.collate([features[i] for i in b])
                        for b in epoch_batches(len(features), settings, 0, lengths=lengths)]
        self.model = make_model(spec)
        self.optimizer = build_optimizer(self.model, settings, torch.device("cpu"))
        self.forward = self.model
        if variant.endswith("compile"):
            self.forward = torch.compile(self.model, dynamic=True)
        self.real_tokens = sum(int(b["attention_mask"].sum()) for b in self.batches)
        self.padded_tokens = sum(int(b["input_ids"].numel()) for b in self.batches)
        self.examples = sum(int(b["input_ids"].shape[0]) for b in self.batches)

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        with autocast(torch.device("cpu"), self.dtype):
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
    contestants = [Contestant(v, work["spec"], work["features"], work["batch_size"], all_cores) for v in variants]
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
    print(f"{'workload':<22}{'variant':<28}{'thr':>4}{'padded/real':>12}{'examples/s':>12}{'real tok/s':>12}"
          f"{'speedup':>9}")
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
    from tasks.runtime.cpu import usable_cpus as usable_cores

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
        print(f"{name:<22}{entry['examples']:>8}  padded/real random {entry['random']:.2f}  "
              f"grouped {entry['grouped']:.2f}", flush=True)
    table = ["| training set (all of it) | examples | padded / real tokens, random order | length-grouped |",
             "|---|---:|---:|---:|"]
    table += [f"| {r['workload']} | {r['examples']:,} | {r['random']:.2f} | {r['grouped']:.2f} |" for r in rows]
    output.write_text(json.dumps({"machine": machine_facts(usable_cores()), "batch_size": 32, "results": rows,
                                  "markdown": "\n".join(table)}, indent=2) + "\n")
    print(f"wrote {output}")


def main(argv: list[str] | None = None) -> None:
    from tasks.runtime.cpu import usable_cpus as usable_cores

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compile", action="store_true", help="also the torch.compile variant")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--sst2-examples", type=int, default=256, help="SST-2 sentences per epoch (8 batches)")
    parser.add_argument("--squad-questions", type=int, default=48, help="SQuAD questions (their windows)")
    parser.add_argument("--conll-sentences", type=int, default=64, help="--precision: CoNLL-2003 sentences")
    parser.add_argument("--precision", action="store_true",
                        help="fp32 vs bf16 autocast (and fp32-compile with --compile) on classification, NER and "
                             "QA (SQuAD windows of 384) -> bench/results/finetune_precision.json")
    parser.add_argument("--only", nargs="+", help="workload names to run (prefix match)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--padding-only", action="store_true",
                        help="only padded/real tokens over the whole training sets (no timing) -> "
                             "bench/results/finetune_padding.json")
    args = parser.parse_args(argv)
    if args.padding_only:
        return padding_of_whole_sets(RESULTS.with_name("finetune_padding.json"))

    all_cores = usable_cores()  # every core, whatever the load (the trainer's default also looks at the load)
    if args.precision:
        variants = list(PRECISION_VARIANTS if args.compile else PRECISION_VARIANTS[:2])
        output = args.output if args.output != RESULTS else RESULTS.with_name("finetune_precision.json")
        loads = workloads(args.sst2_examples, args.squad_questions, args.conll_sentences, squad_lengths=(384,))
    else:
        variants = list(VARIANTS if args.compile else VARIANTS[:3])
        output = args.output
        loads = workloads(args.sst2_examples, args.squad_questions)
    settings = {"variants": variants, "repetitions": args.repetitions, "sst2_examples": args.sst2_examples,
                "squad_questions": args.squad_questions, "all_cores": all_cores,
                "conll_sentences": args.conll_sentences if args.precision else None,
                "step": "forward (bf16 variants: under bf16 autocast) + backward + clip_grad_norm_(1.0) + "
                        "fused AdamW step + zero_grad; weights and AdamW state fp32"}
    print("settings:", json.dumps(settings), flush=True)
    machine = machine_facts(all_cores)
    machine["cpu_native_bf16"] = cpu_bf16_support()
    machine["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    results = []
    for name, work in loads.items():
        if args.only and not any(name.startswith(prefix) for prefix in args.only):
            continue
        results.append(benchmark(name, work, variants, args.repetitions, all_cores))
    print()
    print_table(results)
    machine["load_average_after"] = machine_facts()["load_average"]
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"machine": machine, "settings": settings, "results": results,
                                  "markdown": markdown_table(results)}, indent=2) + "\n")
    print(f"\nwrote {output}")


if __name__ == "__main__":
    main()
