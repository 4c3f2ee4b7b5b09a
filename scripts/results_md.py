"""Regenerate the tables of docs/RESULTS.md from the fine-tuning run records (bench/results/finetune/*.json).

Each record is a run's `finetune_run.json` (settings, data sizes, minutes, dev metrics, speed,
provenance). The script rewrites only the blocks between `<!-- generated:NAME -->` and
`<!-- /generated:NAME -->` in docs/RESULTS.md; the prose around them must not repeat their numbers.

    python scripts/results_md.py [--check]   # --check: exit 1 if the file is not up to date
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from berth.sweep.report import with_block

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "bench" / "results" / "finetune"
RESULTS = REPO / "docs" / "RESULTS.md"


@dataclass(frozen=True)
class Target:
    """A research recipe's target: `metric` of the dev metrics (as recorded) must reach `floor` (in `scale` units)."""

    task: str
    metric: str
    floor: float
    scale: float  # recorded value x scale = the value shown (accuracy 0.91 -> 91)


TARGETS = {
    "STS-B": [Target("STS-B", "pearson", 0.85, 1.0)],
    "MRPC": [Target("MRPC", "accuracy", 84, 100), Target("MRPC", "f1", 88, 100)],
    "SST-2": [Target("SST-2", "accuracy", 90, 100)],
    "CoNLL-2003": [Target("CoNLL-2003", "f1", 90, 100)],
    "SQuAD v1.1": [Target("SQuAD v1.1", "f1", 65, 1)],
    "SQuAD v2.0": [Target("SQuAD v2.0", "f1", 60, 1), Target("SQuAD v2.0", "HasAns_f1", 40, 1)],
}


def task_of(record: dict) -> str:
    s = record["settings"]
    train = str(s["train_file"]).lower()
    if s["task"] == "qa":
        return "SQuAD v2.0" if ("v2" in train or s.get("version_2_with_negative")) else "SQuAD v1.1"
    if s["task"] == "ner":
        name = "CoNLL-2003" if "conll2003" in train else "NER"
        return f"{name} (feature-based)" if s.get("feature_based") else name
    for key, name in (("sst2", "SST-2"), ("mrpc", "MRPC"), ("stsb", "STS-B")):
        if key in train:
            return name
    return s["task"]


def load_records(folder: Path = RECORDS) -> list[dict]:
    records = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if "settings" not in record:  # a `berth evaluate` record (model, data, metrics): the prose cites it
            continue
        record["_name"] = path.stem
        record["_task"] = task_of(record)
        records.append(record)
    return records


def this_session(record: dict) -> bool:
    """Records with provenance (git revision, versions, threads, speed) come from the research recipes
    (`berth build-defaults --data-dir ../shared/data`)."""
    return "provenance" in record


def is_sweep(record: dict) -> bool:
    """A run of the small learning-rate sweep (a training subset): its own table, not a target's run."""
    return record["_name"].startswith("sweep-")


def sweep_table(records: list[dict]) -> str:
    lines = ["| task | training examples | epochs | sequence length | learning rate | dev metrics (all dev examples) | "
             "train min | record |", "|---|---:|---:|---:|---:|---|---:|---|"]
    for r in sorted(filter(is_sweep, records), key=lambda r: (r["_task"], r["settings"]["learning_rate"])):
        s = r["settings"]
        lines.append(f"| {r['_task']} | {r['train_examples']:,} | {r['train_result']['epochs']:.2f} | "
                     f"{s['max_seq_length']} | {s['learning_rate']:g} | {headline(r)} | {r['train_minutes']:.1f} | "
                     f"`{r['_name']}` |")
    return "\n".join(lines) if len(lines) > 2 else "(no sweep records: bench/results/finetune/sweep-*.json)"


def headline(record: dict) -> str:
    m, task = record["dev_metrics"], record["_task"]
    if task.startswith("SQuAD"):
        text = f"EM {m['exact']:.1f} / F1 {m['f1']:.1f}"
        if "HasAns_f1" in m and "NoAns_f1" in m:
            abstain = 100 * m["NoAns_total"] / m["total"]  # F1 of answering "no answer" everywhere
            text += (f" (HasAns F1 {m['HasAns_f1']:.1f}, NoAns F1 {m['NoAns_f1']:.1f}; "
                     f"{m['f1'] - abstain:+.2f} over always abstaining)")
        return text
    if "pearson" in m:
        return f"Pearson {m['pearson']:.3f} / Spearman {m['spearman']:.3f}"
    if task == "CoNLL-2003" or record["settings"]["task"] == "ner":
        return f"entity F1 {100 * m['f1']:.1f} (P {100 * m['precision']:.1f}, R {100 * m['recall']:.1f})"
    text = f"accuracy {100 * m['accuracy']:.1f}"
    if "f1" in m:
        text += f", F1 {100 * m['f1']:.1f}"
    return text


def speed(record: dict) -> tuple[str, str, str, str]:
    """threads, examples/s, real tokens/s, padded/real: from the record, or what it lacks shown as such."""
    t = record["train_result"]
    sp = record.get("speed")
    threads = str(sp["threads"]) if sp else str(record["settings"].get("threads") or "?")
    padding = f"{sp['padded_over_real_tokens']:.2f}" if sp else "not recorded"
    return threads, f"{t['examples_per_s']:.1f}", f"{t['tokens_per_s']:.0f}", padding


def runs_table(records: list[dict]) -> str:
    lines = ["| run record | task | dev metrics (all dev examples) | train min | "
             "examples trained / training examples read | threads | examples/s | real tokens/s | "
             "padded / real tokens | git revision |",
             "|---|---|---|---:|---|---:|---:|---:|---:|---|"]
    for r in records:
        t, s = r["train_result"], r["settings"]
        seen = round(t["epochs"] * r["train_examples"]) if s["task"] != "qa" else None
        trained = (f"{seen:,} / {r['train_examples']:,} ({t['epochs']:.2f} epochs)" if seen is not None
                   else f"{t['epochs']:.2f} epochs of {r['train_examples']:,} questions' windows")
        revision = (r.get("provenance") or {}).get("git_revision") or "not recorded"
        threads, examples_s, tokens_s, padding = speed(r)
        lines.append(f"| `{r['_name']}` | {r['_task']} | {headline(r)} | {r['train_minutes']:.1f} | {trained} | "
                     f"{threads} | {examples_s} | {tokens_s} | {padding} | {revision[:12]} |")
    return "\n".join(lines)


def targets_table(records: list[dict]) -> str:
    lines = ["| task | target | measured this session | met? | what the run was |", "|---|---|---|---|---|"]
    for task, targets in TARGETS.items():
        runs = [r for r in records if r["_task"] == task and this_session(r) and not is_sweep(r)]
        best = max(runs, key=lambda r: r["dev_metrics"].get(targets[0].metric, float("-inf")), default=None)
        for target in targets:
            goal = f"{target.metric} ≥ {target.floor:g}"
            if best is None or target.metric not in best["dev_metrics"]:
                lines.append(f"| {task} | {goal} | not run this session | — | — |")
                continue
            value = best["dev_metrics"][target.metric] * target.scale
            verdict = "yes" if value >= target.floor else f"no, short by {target.floor - value:.3g}"
            lines.append(f"| {task} | {goal} | {value:.3g} (`{best['_name']}`) | {verdict} | {recipe(best)} |")
    return "\n".join(lines)


SPEED = REPO / "bench" / "results" / "finetune_speed.json"


def speed_table(records: list[dict]) -> str:
    """The fine-tuning speed benchmark (bench/finetune_speed.py): its own markdown table and machine facts."""
    if not SPEED.is_file():
        return "(not measured: run `python -m bench.finetune_speed`)"
    data = json.loads(SPEED.read_text(encoding="utf-8"))
    m = data["machine"]
    facts = (f"Measured {m['timestamp']} at git {str(m['git_revision'])[:12]}, {m['cpu_model']}, "
             f"{m['usable_cores']} usable cores, torch {m['libraries'].get('torch')}, load average "
             f"{m['load_average'][0]:.1f} before / {m['load_average_after'][0]:.1f} after (a shared machine: "
             f"read the speed-up column, measured side by side, not the absolute rates).")
    return data["markdown"] + "\n\n" + facts


PRECISION = REPO / "bench" / "results" / "finetune_precision.json"


def precision_table(records: list[dict]) -> str:
    """fp32 against bf16 autocast (bench/finetune_speed.py --precision), with the CPU's bf16 facts."""
    if not PRECISION.is_file():
        return "(not measured: run `python -m bench.finetune_speed --precision`)"
    data = json.loads(PRECISION.read_text(encoding="utf-8"))
    m = data["machine"]
    native = m.get("cpu_native_bf16") or {}
    has = [name for name, present in native.items() if present]
    facts = (f"Measured {m['timestamp']} at git {str(m['git_revision'])[:12]}, {m['cpu_model']} (flags: "
             f"{', '.join(m['cpu_flags'])}; torch CPU capability {m.get('torch_cpu_capability')}; native bf16: "
             f"{', '.join(has) if has else 'none'}), {m['usable_cores']} usable cores, torch "
             f"{m['libraries'].get('torch')}, load average {m['load_average'][0]:.1f} before / "
             f"{m['load_average_after'][0]:.1f} after; {data['settings']['repetitions']} repetitions, medians.")
    return data["markdown"] + "\n\n" + facts


def recipe(record: dict) -> str:
    """What was tried, from the record: steps run of those planned, budget, rate, pooling, threads."""
    s, sched = record["settings"], record.get("schedule") or {}
    steps = (f"{sched['steps']} of {sched['planned_steps']} planned steps" if sched
             else f"{record['train_result']['steps']} steps")
    budget = (f", budget {s['max_minutes']:g} min" + (" (fitted)" if sched.get("fitted_to_budget") else "")
              if s.get("max_minutes") else "")
    chosen = record.get("pooling") or s.get("pooling")
    if chosen == "auto":  # records made before the choice was recorded
        from training.bert.checkpoint import default_base_path
        from training.finetuning.finetune import default_pooling

        base = default_base_path() if s.get("base") == "default" else Path(record["base"])  # venvs move
        chosen = default_pooling(base) if base.is_dir() else chosen
    pooling = f", {chosen} pooling" if chosen and s["task"] in ("classification", "pair") else ""
    return (f"{steps} ({record['train_result']['epochs']:.2f} epochs){budget}, lr {s['learning_rate']:g}, "
            f"batch {s['batch_size']}{pooling}, {record['speed']['threads']} threads")


PADDING = REPO / "bench" / "results" / "finetune_padding.json"


def padding_table(records: list[dict]) -> str:
    if not PADDING.is_file():
        return "(not measured: run `python -m bench.finetune_speed --padding-only`)"
    data = json.loads(PADDING.read_text(encoding="utf-8"))
    return data["markdown"] + f"\n\n(batch {data['batch_size']}, git {str(data['machine']['git_revision'])[:12]})"


PROBE = REPO / "bench" / "results" / "pooling_probe.json"


def pooling_table(records: list[dict]) -> str:
    """The linear probe of bench/pooling_probe.py: the measurement behind --pooling auto."""
    if not PROBE.is_file():
        return "(not measured: run `python -m bench.pooling_probe`)"
    data = json.loads(PROBE.read_text(encoding="utf-8"))
    acc, pooler = data["dev_accuracy"], data["pooler"]
    return "\n".join([
        f"| pooling | SST-2 dev accuracy, linear probe on frozen features ({data['train_sentences']:,} training "
        f"sentences, all {data['dev_sentences']} dev) |",
        "|---|---:|",
        *(f"| {name} | {100 * value:.1f} |" for name, value in acc.items()),
        "",
        f"The base's pooler: dense weight std {pooler['weight_std']:.4f}, diagonal mean {pooler['diagonal_mean']:.5f} "
        f"(git {str(data['machine']['git_revision'])[:12]}).",
    ])


def table7(records: list[dict]) -> str:
    """The paper's Table 7 on our base: fine-tuning every weight vs a head trained on frozen features."""
    lines = ["| approach | what is trained | CoNLL-2003 dev (all sentences) | frozen-feature extraction min | "
             "train min | dev eval min | epochs of training sentences | record |",
             "|---|---|---|---:|---:|---:|---|---|"]
    for r in records:
        if not r["_task"].startswith("CoNLL-2003"):
            continue
        s, cache = r["settings"], r.get("feature_cache")
        if s.get("feature_based"):
            approach = "feature-based: concat last four hidden layers"
            trained = (f"BiLSTM {s['lstm_layers']}x{s['lstm_hidden_size']} per direction + linear tag layer on "
                       f"{cache['feature_width']} frozen features per token (cached as {cache['dtype']}, "
                       f"{cache['cache_mb']:,.0f} MB)")
            extraction = f"{cache['extract_minutes']:.1f}"
        else:
            approach, trained, extraction = "fine-tuning", "every weight (encoder + linear tag layer)", "—"
        lines.append(f"| {approach} | {trained} | {headline(r)} | {extraction} | {r['train_minutes']:.1f} | "
                     f"{r['eval_minutes']:.1f} | {r['train_result']['epochs']:.2f} of {r['train_examples']:,} | "
                     f"`{r['_name']}` |")
    return "\n".join(lines)


def evaluation_table(records: list[dict]) -> str:
    """Runs evaluated on dev while training: the best step against the last, and what evaluating cost."""
    lines = ["| run record | evaluated every | evaluations (dev examples each) | best step: dev metric | "
             "last step: dev metric | saved model, all dev examples | evaluating: wall s (share of train + eval) | "
             "final evaluation s |", "|---|---:|---:|---|---|---|---:|---:|"]
    for r in records:
        best = r.get("best") or {}
        if not best.get("evaluations"):
            continue
        metric, scale = best["metric"], 1 if r["_task"].startswith("SQuAD") else 100
        lines.append(f"| `{r['_name']}` | {r['settings']['eval_every_steps']} steps | {len(best['evaluations'])} "
                     f"({best['dev_sample_examples']:,}) | {best['step']}: {metric} {scale * best['value']:.1f} | "
                     f"{best['last_step']}: {metric} {scale * best['last_value']:.1f} | {headline(r)} | "
                     f"{best['eval_seconds']:.0f} ({100 * best['eval_share_of_wall']:.1f}%) | "
                     f"{best['final_eval_seconds']:.0f} |")
    return "\n".join(lines) if len(lines) > 2 else "(no run evaluated while training)"


POOLING_RUNS = [("before", REPO / "bench" / "results" / "pooling_finetune-before.json"),
                ("after", REPO / "bench" / "results" / "pooling_finetune.json"),
                ("after", REPO / "bench" / "results" / "pooling_finetune-mean.json")]


def pooling_finetune_table(records: list[dict]) -> str:
    """bench/pooling_finetune.py: cls vs mean fine-tuned on a user-sized file, and transformers on the saved folder
    (before: the folder as berth saved it until then; after: as it saves it now)."""
    def cell(value) -> str:
        return "refused" if value is None else f"{100 * value:.1f}"

    rows, machines = [], []
    for layout, path in POOLING_RUNS:
        if not path.is_file():
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        machine = data["machine"]
        machines.append(f"{path.name}: git {str(machine['git_revision'])[:12]}, {machine['cpu_model']}, "
                        f"load {machine['load_average'][0]:.1f}")
        for run in data["runs"]:
            plain = run.get("plain_pipeline_dev_accuracy", run["transformers_pipeline_dev_accuracy"])
            with_code = run["transformers_pipeline_dev_accuracy"] if "plain_pipeline_dev_accuracy" in run else None
            rows.append(f"| {layout} | {run['pooling']} | {run['seed']} | {run['epochs']:g} | {run.get('steps', '')} | "
                        f"{cell(run['berth_dev_accuracy'])} | {cell(plain)} | "
                        f"{'—' if with_code is None else cell(with_code)} | {cell(run['labels_agreeing'])} |")
    if not rows:
        return "(not measured: run `python -m bench.pooling_finetune`)"
    return "\n".join([
        "| saved folder | pooling | seed | epochs | steps | berth dev accuracy | transformers pipeline | "
        "pipeline, trust_remote_code | labels agreeing with berth |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|", *rows, "", "Records: " + "; ".join(machines) + "."])


BLOCKS = {"targets": targets_table, "runs": runs_table, "speed": speed_table, "precision": precision_table,
          "padding": padding_table,
          "pooling": pooling_table, "pooling-finetune": pooling_finetune_table, "table7": table7,
          "sweep": sweep_table, "evaluation": evaluation_table}


def render(text: str, records: list[dict]) -> str:
    for name, make in BLOCKS.items():
        text = with_block(text, name, make(records) + "\n", RESULTS)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/RESULTS.md is out of date")
    args = parser.parse_args(argv)
    old = RESULTS.read_text(encoding="utf-8")
    new = render(old, load_records())
    if args.check:
        if new != old:
            print(f"{RESULTS} is out of date: run python scripts/results_md.py", file=sys.stderr)
            return 1
        return 0
    RESULTS.write_text(new, encoding="utf-8")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
