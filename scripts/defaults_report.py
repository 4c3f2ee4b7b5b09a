"""Render the default models' tables (docs/DEFAULTS.md, the README's model table) from run records.

Inputs: the build record(s) `berth build-defaults` writes (`<work>/build_record.json`; several when
the models were built by separate `--only` runs) and, optionally, the JSON of
`scripts/demo_check.py --out`. Nothing is typed by hand.

    python scripts/defaults_report.py runs/defaults/build_record.json --demo demo_check.json > docs/DEFAULTS.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROUTES = {"qa": "/v1/qa", "ner": "/v1/ner", "pair": "/v1/pair", "classification": "/v1/classify",
          "rerank": "/v1/rerank"}


def _number(value: float | None, scale_of: float | None) -> str:
    """SQuAD EM/F1 come on a 0-100 scale, the other metrics (conlleval F1 included) on 0-1."""
    if value is None:
        return "—"
    return f"{value:.1f}" if (scale_of or 0) > 1 else f"{value:.3f}"


def _trained_on(model: dict) -> str:
    """Examples × epochs: from the sizing record (a minute budget), else from the recipe's fixed options."""
    sizing = model.get("sizing")
    if not sizing:
        return f"{model['train_examples']:,} × {model['options'].get('epochs', 1):g}"
    return (f"{sizing['examples_seen']:,} seen of {sizing['shipped_examples']:,}, {sizing['epochs']:.2f} epochs; "
            f"{sizing['train_minutes']:.1f} of {sizing['budget_minutes']:g} min, {sizing['precision']}, "
            f"{sizing['threads']} threads")


def model_table(record: dict) -> str:
    rows = ["| model | route | trained on (examples × epochs) | dev metric | measured | floor | rounds | precision | "
            "minutes (wall / CPU) |", "|---|---|---|---|---|---|---|---|---|"]
    for model in record["models"]:
        quality = model["quality"]
        metric = quality.get("metric", "")
        status = " **(below floor)**" if quality.get("below_floor") else ""
        rows.append(
            f"| `{model['name']}` | `{ROUTES[model['task']]}` | `{model['train']}` ({_trained_on(model)}) | "
            f"{metric} on `{model['dev']}` ({model['dev_examples']:,}) | "
            f"**{_number(quality.get('value'), quality.get('floor'))}**{status} | "
            f"{_number(quality.get('floor'), quality.get('floor'))} | "
            f"{quality.get('rounds', 1)} | {model['precision']} | "
            f"{model['wall_minutes']:.1f} / {model['cpu_minutes']:.1f} |")
    whys = [f"- `{m['name']}`: {m['sizing']['why']}." for m in record["models"] if m.get("sizing")]
    return "\n".join(rows + ([""] + whys if whys else []))


def demo_table(demo: dict) -> str:
    lines = ["| check | result | target |", "|---|---|---|"]
    for key, value in demo["figures"].items():
        target = demo["targets"].get(key)
        lines.append(f"| {key} | **{value:.0%}** | {'reported' if target is None else f'{target:.0%}'} |")
    lines += ["", "| question | answer given | gold | exact |", "|---|---|---|---|"]
    lines += [f"| {r['question']} | {r['answer']} | {r['gold'][0]} | {'yes' if r['exact'] else 'no'} |"
              for r in demo["qa"]]
    lines += ["", "| gold entity | type | found with that span and type |", "|---|---|---|"]
    lines += [f"| {r['text']} | {r['label']} | {'yes' if r['found'] else 'no'} |" for r in demo["ner"]]
    lines += ["", "| sentence | similar pair | unrelated pair | ordered | /v1/similarity: similar, unrelated, "
              "ordered |", "|---|---|---|---|---|"]
    lines += [f"| {r['text']} | {r['similar']:.2f} | {r['unrelated']:.2f} | {'yes' if r['ordered'] else 'no'} | "
              + (f"{r['embeddings']['similar']:.2f}, {r['embeddings']['unrelated']:.2f}, "
                 f"{'yes' if r['embeddings']['ordered'] else 'no'} |" if "embeddings" in r else "— |")
              for r in demo["pairs"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path, nargs="+")
    parser.add_argument("--demo", type=Path, help="the JSON of scripts/demo_check.py --out")
    args = parser.parse_args()
    records = [json.loads(path.read_text(encoding="utf-8")) for path in args.records]
    for path, record in zip(args.records, records):
        machine = record["machine"]
        print(f"- `{path}`: build of {record['started_at']} (git {machine['git_revision']}), "
              f"{', '.join(m['name'] for m in record['models'])}, precision {record['precision']}, "
              f"{machine['cpus']} CPUs ({machine['processor']}; flags "
              f"{', '.join(machine.get('cpu_flags', [])) or 'not recorded'}), torch {machine['torch']} with "
              f"{machine['torch_threads']} threads: {record['total_minutes']:.1f} min wall. Load average "
              f"{machine['load_average_start'][0]:g} at the start, {record['load_average_end'][0]:g} at the end "
              f"(an idle 2-core machine shows about 2).")
    models = [m for r in records for m in r["models"]]
    cpu = sum(m["cpu_minutes"] for m in models)
    print(f"\nCPU time of all models: {cpu:.1f} min, i.e. about {cpu / 2:.1f} min of wall time on 2 idle cores "
          f"(the recipes' own expectation: {sum(m['expected_minutes'] for m in models):g} min).\n")
    print(model_table({"models": models}))
    if args.demo:
        demo = json.loads(args.demo.read_text(encoding="utf-8"))
        print("\n## Demo check (hand-written items, never trained on)\n")
        print(demo_table(demo))
        if "heldout" in demo:
            print("\n### Held-out set (written once, never trained or tuned on; reported, not gated)\n")
            print(demo_table(demo["heldout"]))


if __name__ == "__main__":
    main()
