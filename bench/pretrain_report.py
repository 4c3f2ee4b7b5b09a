"""The tables of docs/PRETRAINING.md's memory, preparation speed, Trainer and WNUT-17 sections, from their records.

Reads bench/results/pretrain/memory.json (bench.pretrain_memory), speed.json (bench.pretrain_speed) and
dapt_wnut.json (bench.dapt_wnut), and rewrites the blocks `<!-- generated:pretrain-NAME -->` of the page; a record
that is absent leaves its block as it is.

    python -m bench.pretrain_report
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from berth.sweep.report import replace_block

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "bench" / "results" / "pretrain"
PAGE = REPO / "docs" / "PRETRAINING.md"


def machine_line(record: dict) -> str:
    m = record["machine"]
    flags = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in m["cpu_flags"]]
    load = ", ".join(f"{x:.1f}" for x in m["load_average"])
    return (f"\n{m['cpu_model']} ({', '.join(flags)}), {m['usable_cores']} cores shared with other engineers' jobs "
            f"(load average at the end: {load}), {m['threads']} thread(s), {m['timestamp']}, "
            f"revision {m['git_revision'][:7]}.\n")


def memory_table(record: dict) -> str:
    lines = ["| corpus | text MB | files | shards | train instances | preparation: largest process MB | "
             "preparation: all processes MB (anonymous + file) | training: peak RSS MB | training: anonymous + "
             "file MB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        workers = max(r["prepare"], key=int)
        p, t = r["prepare"][workers], r["train"]
        lines.append(f"| x{r['scale']} | {r['corpus_mb']:,.1f} | {r['files']:,} | {r['shards']} | "
                     f"{r['train_instances']:,} | {p['ru_maxrss_mb']:,.0f} ({workers} workers) | "
                     f"{p['tree_peak_rss_mb']:,.0f} ({p['tree_peak_anon_mb']:,.0f} + {p['tree_peak_file_mb']:,.0f}) | "
                     f"{t['ru_maxrss_mb']:,.0f} | {t['tree_peak_anon_mb']:,.0f} + {t['tree_peak_file_mb']:,.0f} |")
    spread = record["spread_over_scales"]
    lines.append("")
    lines.append(f"Largest over smallest peak, minus 1, across the sizes: preparation "
                 f"{spread['prepare_peak_rss']:+.1%}, training {spread['train_peak_rss']:+.1%} (its anonymous "
                 f"memory {spread['train_peak_anon']:+.1%}).")
    return "\n".join(lines) + "\n" + machine_line(record)


def preparation_table(record: dict) -> str:
    lines = ["| corpus | workers | wall s | MB/s (wall) | CPU s (all processes) | MB per CPU second |",
             "|---|---|---|---|---|---|"]
    for r in record["rows"]:
        for workers, p in sorted(r["prepare"].items(), key=lambda kv: int(kv[0])):
            lines.append(f"| x{r['scale']} ({r['corpus_mb']:,.1f} MB) | {workers} | {p['wall_s']:,.0f} | "
                         f"{p['mb_per_wall_s']:.2f} | {p['cpu_s']:,.0f} | {p['mb_per_cpu_s']:.2f} |")
    return "\n".join(lines) + "\n" + machine_line(record)


def speed_table(record: dict) -> str:
    s = record["settings"]
    lines = ["| repetition | berth pretrain, tokens/s | Trainer + DataCollatorForLanguageModeling, tokens/s | "
             "berth / Trainer |", "|---|---|---|---|"]
    for i, (b, t, ratio) in enumerate(zip(record["runs"]["berth"], record["runs"]["trainer"],
                                          record["berth_over_trainer"])):
        lines.append(f"| {i + 1} | {b['tokens_per_s']:,.0f} | {t['tokens_per_s']:,.0f} | {ratio:.2f}x |")
    lines.append(f"| median | {statistics.median(b['tokens_per_s'] for b in record['runs']['berth']):,.0f} | "
                 f"{statistics.median(t['tokens_per_s'] for t in record['runs']['trainer']):,.0f} | "
                 f"**{record['berth_over_trainer_median']:.2f}x** |")
    lines.append("")
    lines.append(f"{s['steps']} steps of batch {s['batch_size']} at up to {s['seq_length']} tokens, "
                 f"{record['train_instances']:,} prepared instances, "
                 f"transformers {record['runs']['trainer'][0]['transformers']}.")
    return "\n".join(lines) + "\n" + machine_line(record)


def dapt_table(record: dict) -> str:
    runs = {(r["arm"], r["seed"]): r for r in record["runs"]}
    seeds = sorted({seed for _, seed in runs})
    lines = ["| seed | from the base: dev entity F1 | from the DAPT model: dev entity F1 | difference |",
             "|---|---|---|---|"]
    for seed in seeds:
        base, dapt = runs.get(("base", seed)), runs.get(("dapt", seed))
        cells = [f"{100 * r['dev_metrics']['f1']:.1f}" if r else "—" for r in (base, dapt)]
        diff = f"{100 * (dapt['dev_metrics']['f1'] - base['dev_metrics']['f1']):+.1f}" if base and dapt else "—"
        lines.append(f"| {seed} | {cells[0]} | {cells[1]} | {diff} |")
    summary = record["summary"]
    if "base" in summary and "dapt" in summary:
        def spread(arm: dict) -> str:
            return f"{100 * arm['mean']:.1f} ({100 * arm['min']:.1f}–{100 * arm['max']:.1f})"
        lines.append(f"| mean (range) | {spread(summary['base'])} | {spread(summary['dapt'])} | "
                     f"**{100 * summary['dapt_minus_base']:+.1f}** |")
    p = record.get("pretrain")
    if p:
        t = p["train_result"]
        lines.append("")
        lines.append(f"Continued pretraining: {record['tweets']['tweets']:,} tweets "
                     f"({record['tweets']['bytes'] / 1e6:.1f} MB), {p['head_warmup']['steps']} head-only steps then "
                     f"{t['steps']} steps of batch {record['settings']['batch_size']} at 64 tokens "
                     f"(lr {p['learning_rate']:g}), {t['real_tokens']:,} real tokens, "
                     f"{t['elapsed_s'] / 60:.1f} minutes of training on this shared machine; held-out MLM accuracy "
                     f"{100 * p['heldout_eval']['mlm_accuracy']:.1f}% (unigram baseline "
                     f"{100 * p['heldout_eval']['unigram_accuracy']:.1f}%).")
    return "\n".join(lines) + "\n" + machine_line(record)


BLOCKS = {"pretrain-memory": ("memory.json", memory_table), "pretrain-preparation": ("memory.json", preparation_table),
          "pretrain-speed": ("speed.json", speed_table), "pretrain-dapt": ("dapt_wnut.json", dapt_table)}


def main() -> None:
    for block, (name, make) in BLOCKS.items():
        path = RECORDS / name
        if path.is_file():
            replace_block(PAGE, block, make(json.loads(path.read_text())))
            print(f"{PAGE.relative_to(REPO)}: {block} from {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
