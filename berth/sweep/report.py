"""A sweep record (sweep.json) as Markdown: one row per cell (mean ± std over restarts, min, max, the best
restart, failures), the winner, and the cell with the best mean. Generated, never typed.

    python -m berth.sweep.report OUT/sweep.json [--scale 100]
    python -m berth.sweep.report RECORD.json --into docs/RESULTS.md --block NAME  # rewrite one block

`--into` replaces the text between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->` and nothing else.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any


def _number(value: float | None, scale: float) -> str:
    return "–" if value is None else f"{value * scale:.1f}" if scale != 1 else f"{value:.4g}"


def _setting(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def markdown(record: dict[str, Any], scale: float = 100.0) -> str:
    """The cells table and the winner's line; `scale` turns fractions into points (1 for SQuAD, already %)."""
    metric = record["metric"]
    keys = list(record["grid"]) or ["(settings as given)"]
    head = "| " + " | ".join(keys) + f" | restarts ok / run | dev {metric} mean ± std | min | max | best restart |"
    lines = [head, "|" + "---:|" * (len(keys) + 5)]
    for cell in record["cells"]:
        settings = [_setting(cell["settings"].get(key, "")) for key in keys] if record["grid"] else ["–"]
        ran = cell["restarts"] - cell["not_run"]
        spread = "" if cell["std"] is None else f" ± {_number(cell['std'], scale)}"
        failed = f" ({cell['failed']} failed)" if cell["failed"] else ""
        best = cell["best"]
        best_text = f"{_number(best['value'], scale)} (seed {best['seed']})" if best else "–"
        lines.append("| " + " | ".join(settings) + f" | {cell['ok']} / {ran}{failed} | {_number(cell['mean'], scale)}"
                     f"{spread} | {_number(cell['min'], scale)} | {_number(cell['max'], scale)} | {best_text} |")
    winner = record.get("winner")
    lines.append("")
    if winner:
        settings = ", ".join(f"{k} {_setting(v)}" for k, v in winner["settings"].items()) or "the settings as given"
        others = ", ".join(f"{k} {_number(v, scale)}" for k, v in winner["dev_metrics"].items()
                           if k != metric and isinstance(v, int | float))
        tie = f"; tied with {', '.join(winner['ties'])}" if winner["ties"] else ""
        lines.append(f"Winner (best single trial on dev): `{winner['id']}`, {settings}, seed {winner['seed']}: "
                     f"dev {metric} {_number(winner['value'], scale)}" + (f" ({others})" if others else "") + tie
                     + ".")
    by_mean = record.get("best_cell_by_mean")
    if by_mean:
        settings = ", ".join(f"{k} {_setting(v)}" for k, v in by_mean["settings"].items()) or "the one cell"
        lines.append(f"Best mean over restarts: {settings} ({_number(by_mean['mean'], scale)}).")
    lines += ["", "| trial | " + " | ".join(keys) + f" | seed | status | dev {metric} | minutes |",
              "|---|" + "---:|" * (len(keys) + 4)]
    for trial in record["trials"]:
        settings = [_setting(trial["settings"].get(key, "")) for key in keys] if record["grid"] else ["–"]
        value = (trial.get("dev_metrics") or {}).get(metric)
        status = trial["status"] + (f": {trial['error']}" if trial.get("error") else "")
        minutes = f"{trial['minutes']:.1f}" if "minutes" in trial else "–"
        lines.append(f"| `{trial['id']}` | " + " | ".join(settings) + f" | {trial['seed']} | {status} | "
                     f"{_number(value, scale) if isinstance(value, int | float) else '–'} | {minutes} |")
    lines.append("")
    counts = record["counts"]
    stopped = f", {counts['stopped']} stopped early" if counts.get("stopped") else ""
    lines.append(f"Trials: {counts['ok']} ok, {counts['failed']} failed{stopped}, {counts['not_run']} not run; "
                 f"{record['minutes']:.1f} trial-minutes; stopped: {record['stopped_by']}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path, help="a sweep.json, or the sweep folder holding it")
    parser.add_argument("--scale", type=float, default=100.0, help="multiply metrics by this (default: %(default)s)")
    parser.add_argument("--into", type=Path, help="a Markdown file whose --block to rewrite with the table")
    parser.add_argument("--block", help="the name of the generated block in --into")
    args = parser.parse_args(argv)
    path = args.record / "sweep.json" if args.record.is_dir() else args.record
    table = markdown(json.loads(path.read_text(encoding="utf-8")), args.scale)
    if not args.into:
        print(table, end="")
        return 0
    replace_block(args.into, args.block, table)
    return 0


def replace_block(path: Path, block: str, table: str) -> None:
    """Rewrite the text between `<!-- generated:BLOCK -->` and `<!-- /generated:BLOCK -->` in the file at `path`."""
    text = path.read_text(encoding="utf-8")
    path.write_text(with_block(text, block, table, path), encoding="utf-8")


def with_block(text: str, block: str, content: str, where: Path | str) -> str:
    """`text` with `content` between its `<!-- generated:BLOCK -->` line and `<!-- /generated:BLOCK -->`;
    SystemExit naming `where` when it has no such block."""
    name = re.escape(block)
    pattern = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated:{name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{where}: no <!-- generated:{block} --> block")
    return pattern.sub(lambda m: m.group(1) + content + m.group(2), text)


if __name__ == "__main__":
    raise SystemExit(main())
