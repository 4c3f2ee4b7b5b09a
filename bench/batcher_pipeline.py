"""Does taking and padding the next batch while a pass runs (`pipeline`) keep the engine busier?

In one process, no HTTP: a real bundle's ONNX Runtime engine behind the service's `Batcher`, and N closed-loop
clients on the event loop, each submitting one request of one real input, awaiting it, spending
`--request-cpu-ms` of event-loop CPU (what parsing, tokenizing and serializing cost a request in the server)
and submitting again. Pipeline on and off alternate, round after round, so both see the same neighbours;
reported: items/s and the engine's busy share (time inside forward passes / wall time) per round.
`--compare gil` alternates the GIL switch interval instead (pipeline on): Python's default 5 ms against
`--switch-interval-ms`: how long a finished pass's worker thread can wait for the event loop's GIL.

    .venv/bin/python -m bench.batcher_pipeline models/sst2 --clients 32 --rounds 5 --seconds 3
    .venv/bin/python -m bench.batcher_pipeline models/sst2 --compare gil --out bench/results/batcher_gil.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.machine import machine_facts
from service.batcher import Batcher, BatchPolicy, clip_buckets
from service.metrics import Metrics
from service.models import OnnxEngine, load_bundle_tokenizer
from tasks import common
from tasks.bundle_checks import load_bundle
from tasks.registry import definition

SENTENCE = "It's a charming and often affecting journey, though it drags a little in its second half."


class TimedEngine:
    """The engine, adding up the seconds spent inside forward passes."""

    def __init__(self, engine: OnnxEngine):
        self.engine = engine
        self.busy = 0.0

    def __call__(self, feeds):
        begin = time.perf_counter()
        try:
            return self.engine(feeds)
        finally:
            self.busy += time.perf_counter() - begin


async def one_round(engine: TimedEngine, bundle: Any, item: Any, pipeline: bool, clients: int, seconds: float,
                    request_cpu_s: float, max_batch_size: int) -> dict[str, float]:
    spec = bundle.spec()
    policy = BatchPolicy(buckets=clip_buckets([16, 32, 64, 128, 256, 384, 512], spec.max_seq_length),
                         max_batch_size=max_batch_size, pad_multiple=8, pipeline=pipeline)
    batcher = Batcher("bench", engine, policy, Metrics(), per_token=definition(spec.task).per_token)
    batcher.start()
    done = 0
    stop = time.monotonic() + seconds

    async def client() -> None:
        nonlocal done
        while time.monotonic() < stop:
            await batcher.submit([item], time.monotonic() + 60)[0]
            spin_until = time.perf_counter() + request_cpu_s  # the request's own event-loop work
            while time.perf_counter() < spin_until:
                pass
            done += 1
            await asyncio.sleep(0)

    engine.busy = 0.0
    begin = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - begin
    await batcher.close(5)
    return {"items_per_s": done / wall, "engine_busy_share": engine.busy / wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path, help="a classification or pair bundle")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--request-cpu-ms", type=float, default=0.5)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compare", choices=["pipeline", "gil"], default="pipeline",
                        help="what alternates: the pipeline on and off, or the GIL switch interval (Python's 5 ms "
                             "and --switch-interval-ms)")
    parser.add_argument("--switch-interval-ms", type=float, default=0.5)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "batcher_pipeline.json")
    args = parser.parse_args(argv)

    bundle = load_bundle(args.bundle)
    engine = TimedEngine(OnnxEngine(bundle, args.threads, prefer_gpu=False))
    item = common.encode_classification(load_bundle_tokenizer(bundle), SENTENCE,
                                        max_length=bundle.spec().max_seq_length)
    # (label, pipeline, GIL switch interval): "on" the change measured, "off" what it is compared with
    default_interval = sys.getswitchinterval()
    variants = {"on": (True, default_interval), "off": (False, default_interval)} if args.compare == "pipeline" \
        else {"on": (True, args.switch_interval_ms / 1000), "off": (True, default_interval)}
    rows: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    for number in range(args.rounds):
        for side in ("on", "off") if number % 2 == 0 else ("off", "on"):
            pipeline, interval = variants[side]
            sys.setswitchinterval(interval)
            row = asyncio.run(one_round(engine, bundle, item, pipeline, args.clients, args.seconds,
                                        args.request_cpu_ms / 1000, args.max_batch_size))
            rows[side].append(row)
            print(f"round {number + 1} pipeline {'on ' if pipeline else 'off'}, GIL switch interval "
                  f"{1000 * interval:g} ms: {row['items_per_s']:.1f} items/s, "
                  f"engine busy {100 * row['engine_busy_share']:.0f}%", flush=True)
    summary = {side: {key: statistics.median(r[key] for r in rows[side])
                      for key in ("items_per_s", "engine_busy_share")}
               for side in rows}
    summary["paired_gain"] = statistics.median(on["items_per_s"] / off["items_per_s"]
                                               for on, off in zip(rows["on"], rows["off"]))
    summary["compared"] = {side: {"pipeline": p, "gil_switch_interval_s": i} for side, (p, i) in variants.items()}
    result = {"bundle": args.bundle.name, "settings": {k: str(v) for k, v in vars(args).items()},
              "machine": machine_facts(args.threads, ("onnxruntime", "numpy")),
              "load_average": list(os.getloadavg()), "rounds": rows, "summary": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
