"""`berth predict` rows/s against the raw engine's best batch throughput on the same bundle and rows.

The engine ceiling: the same rows tokenized ahead (not timed), sorted by length, cut into batches of one size
padded to their longest item rounded up to 8 (as berth predict pads on the CPU), and only `session.run`
timed; the best batch size of those tried is the ceiling. `berth predict` is timed end to end (a
subprocess: model load, reading, tokenizing, passes, decoding, writing Parquet, the final file). Usage:

    .venv/bin/python -m bench.predict_speed --bundle /path/to/repository/sentiment           # SST-2 train, 67k
    .venv/bin/python -m bench.predict_speed --bundle ... --rows 20000 --threads 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import machine_facts

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
SST2_TRAIN = REPO.parent / "shared" / "data" / "sst2" / "train.tsv"


def engine_ceiling(bundle: Path, texts: list[str], threads: int, batch_sizes: list[int]) -> dict[int, float]:
    """Rows/s of session.run alone per batch size, over the rows sorted by length."""
    from predict.run import Model
    from tasks.batching import pad_batch
    from tasks.common import encode_classification_many

    model = Model(bundle, threads)
    items = sorted(encode_classification_many(model.tokenizer, texts, None, max_length=model.spec.max_seq_length,
                                              truncate=True), key=len)
    names = list(model.definition.output_names)[:1]
    rates = {}
    for size in batch_sizes:
        feeds = []
        for at in range(0, len(items), size):
            batch = items[at : at + size]
            width = -(-max(len(x) for x in batch) // 8) * 8
            padded = pad_batch(batch, pad_to=width)
            feeds.append({name: padded[name] for name in model.input_names})
        model.session.run(names, feeds[len(feeds) // 2])  # warm
        started = time.perf_counter()
        for feed in feeds:
            model.session.run(names, feed)
        rates[size] = len(items) / (time.perf_counter() - started)
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=SST2_TRAIN, help="an SST-2 style TSV (sentence column)")
    parser.add_argument("--rows", type=int, default=0, help="the first N rows (0: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 32, 64])
    parser.add_argument("--out", type=Path, default=RESULTS / "predict_speed.json")
    args = parser.parse_args(argv)

    with open(args.data, encoding="utf-8") as f:
        lines = f.read().splitlines()
    header, body = lines[0], lines[1:]
    if args.rows:
        body = body[: args.rows]
    texts = [line.split("\t")[0] for line in body]
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "input.tsv"
        source.write_text("\n".join([header, *body]) + "\n", encoding="utf-8")
        out = Path(folder) / "out.parquet"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "berth.cli", "predict", str(args.bundle), str(source), "--out",
                               str(out), "--text-column", "sentence", "--threads", str(args.threads), "--no-progress"],
                              cwd=REPO, capture_output=True, text=True, check=True)
        wall = time.perf_counter() - started
        summary = json.loads(done.stdout.strip().splitlines()[-1])
    predict_rate = len(texts) / wall
    rates = engine_ceiling(args.bundle, texts, args.threads, args.batch_sizes)
    best = max(rates, key=rates.get)
    result = {"bundle": str(args.bundle), "rows": len(texts), "threads": args.threads,
              "predict_rows_per_s": round(predict_rate, 1), "predict_wall_s": round(wall, 2),
              "predict_summary": summary, "engine_rows_per_s": {str(k): round(v, 1) for k, v in rates.items()},
              "engine_best_batch_size": best, "ratio": round(predict_rate / rates[best], 3),
              "machine": machine_facts(args.threads)}
    print(f"| what | rows/s |\n|---|---:|\n| berth predict (end to end, {len(texts):,} rows) | {predict_rate:,.0f} |")
    for size, rate in rates.items():
        print(f"| engine, session.run only, batch {size} | {rate:,.0f} |")
    print(f"\nberth predict / best engine batch ({best}): {result['ratio']:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
