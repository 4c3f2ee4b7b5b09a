"""A lone request's forward pass after the server sat idle, per ONNX Runtime spinning setting, and what each costs
in CPU between passes.

A lone request runs on the wide session (every thread). How fast depends on what its threads did while the server
waited: `berth serve` lets them spin between the operators of a pass and stops them when the pass ends
(`ort_spin_in_pass`, the default), `--no-ort-spin-in-pass` never spins, and `--ort-spinning` is ONNX Runtime's
own default, which keeps spinning after every pass until its spin count runs out. Per bundle, the three sessions
as the service builds them (weights shared, prepacked, the process's arena), on real dev inputs (`--input`, from
bench/service_load.py's workloads; by default the task's short and long one, as bench/serving_ceiling.py): the
pass's median time after `--idle` milliseconds without work, the cores the process keeps busy in the
`--after` milliseconds that follow one pass (the spin's cost), and the request's own tokenizing (the task's
`prepare_many` of the input) timed back to back and right after a pass: the Python around a lone pass runs on
caches the pass has just flushed. The settings alternate round by round.

    python -m bench.lone_pass /path/to/topics /path/to/entities --rounds 4 --out bench/results/lone_pass.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.local_processes import REPO
from bench.machine import machine_facts
from bench.records import write_record

# label -> (allow_spinning, spin_between_runs), as service/models.py `spinning` maps the serve flags
SETTINGS = {"spin in pass, stop after (default)": (True, False), "no spinning (--no-ort-spin-in-pass)": (False, False),
            "spin between passes (--ort-spinning)": (True, True)}


def sessions(folder: Path, threads: int) -> tuple[Any, dict[str, Any]]:
    from tasks.bundle_checks import load_bundle
    from tasks.runtime.onnx_session import MemoryPolicy, create_session, memory_policy, set_memory_policy

    bundle = load_bundle(folder)
    raw = bundle.model_path.read_bytes()
    before = memory_policy()  # the policy is the process's: put it back once these sessions exist
    set_memory_policy(MemoryPolicy.serving())
    try:
        return bundle, {label: create_session(raw, bundle.precision, threads, prefer_gpu=False, allow_spinning=spin,
                                              spin_between_runs=between)[0]
                        for label, (spin, between) in SETTINGS.items()}
    finally:
        set_memory_policy(before)


def request_of(bundle: Any, input_name: str) -> tuple[dict[str, Any], Callable[[], Any]]:
    """The input's padded feeds, and its tokenizing as the request path does it."""
    from bench.serving_ceiling import request_bodies
    from tasks.registry import definition
    from tasks.runtime.batching import pad_batch
    from tasks.runtime.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(bundle.tokenizer_path)
    task = definition(bundle.task)
    text, spec, options = request_bodies(tokenizer)[input_name]["inputs"], bundle.spec(), task.options()

    def prepare() -> Any:
        return task.prepare_many(tokenizer, spec, [text], options)

    return pad_batch([i for p in prepare() for i in p.items]), prepare


def after_idle(session: Any, feeds: dict[str, Any], idle_s: float, passes: int) -> list[float]:
    """Seconds of each of `passes` passes, each after `idle_s` without work."""
    times = []
    for _ in range(passes):
        time.sleep(idle_s)
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return times


def cpu_after(session: Any, feeds: dict[str, Any], window_s: float, passes: int) -> float:
    """Median cores the process kept busy during `window_s` after one pass (the threads' spinning)."""
    shares = []
    for _ in range(passes):
        time.sleep(0.3)  # any session's spin (this process's CPU counts them all) has ended
        session.run(None, feeds)
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(window_s)
        shares.append((time.process_time() - cpu) / (time.perf_counter() - wall))
    return statistics.median(shares)


def prepare_after_a_pass(session: Any, feeds: dict[str, Any], prepare: Callable[[], Any],
                         passes: int) -> tuple[float, float]:
    """Median microseconds of tokenizing the input back to back (no pass between), and right after a pass."""
    prepare()
    warm, after = [], []
    for _ in range(passes):
        start = time.perf_counter()
        prepare()
        warm.append(time.perf_counter() - start)
    for _ in range(passes):
        session.run(None, feeds)
        start = time.perf_counter()
        prepare()
        after.append(time.perf_counter() - start)
    return 1e6 * statistics.median(warm), 1e6 * statistics.median(after)


def measure(folder: Path, inputs: list[str] | None, idles_ms: list[float], after_ms: float, rounds: int, passes: int,
            threads: int) -> list[dict[str, Any]]:
    from bench.serving_ceiling import INPUTS

    bundle, by_setting = sessions(folder, threads)
    rows = []
    for input_name in inputs or INPUTS[bundle.task]:
        feeds, prepare = request_of(bundle, input_name)
        feeds_by = {label: {n.name: feeds[n.name] for n in s.get_inputs()} for label, s in by_setting.items()}
        for label, session in by_setting.items():
            session.run(None, feeds_by[label])
        pass_ms: dict[str, dict[float, list[float]]] = {label: {i: [] for i in idles_ms} for label in by_setting}
        for round_ in range(rounds):
            order = list(by_setting) if round_ % 2 == 0 else list(reversed(by_setting))
            for idle in idles_ms:
                for label in order:
                    time.sleep(0.3)
                    pass_ms[label][idle] += [1000 * t for t in after_idle(by_setting[label], feeds_by[label],
                                                                          idle / 1000, passes)]
        for label, session in by_setting.items():
            rows.append({"bundle": folder.name, "precision": bundle.precision, "input": input_name,
                         "tokens": int(feeds["input_ids"].shape[1]), "setting": label,
                         "pass_ms_after_idle": {str(i): statistics.median(v) for i, v in pass_ms[label].items()},
                         "cores_busy_after_a_pass": cpu_after(session, feeds_by[label], after_ms / 1000, passes)})
            warm, after = prepare_after_a_pass(session, feeds_by[label], prepare, 3 * passes)
            rows[-1].update(tokenize_us_back_to_back=warm, tokenize_us_right_after_a_pass=after)
    return rows


def table(result: dict[str, Any]) -> str:
    idles = result["args"]["idle_ms"]
    lines = ["| bundle | input (tokens) | setting | " + " | ".join(f"pass ms after {i:g} ms idle" for i in idles)
             + f" | cores busy in the {result['args']['after_ms']:g} ms after a pass"
             + " | tokenizing µs: back to back / right after a pass |",
             "|---|---|---|" + "---|" * (len(idles) + 2)]
    for row in result["rows"]:
        times = " | ".join(f"{row['pass_ms_after_idle'][str(i)]:.2f}" for i in idles)
        lines.append(f"| {row['bundle']} | {row['input']} ({row['tokens']}) | {row['setting']} | {times} | "
                     f"{row['cores_busy_after_a_pass']:.2f} | {row['tokenize_us_back_to_back']:.0f} / "
                     f"{row['tokenize_us_right_after_a_pass']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", nargs="*", type=Path)
    parser.add_argument("--input", nargs="+", help="workload names (bench/service_load.py, bench/serving_ceiling.py; "
                                                    "default: the task's short and long input)")
    parser.add_argument("--idle", type=float, nargs="+", default=[1.0, 20.0, 100.0], help="milliseconds")
    parser.add_argument("--after", type=float, default=50.0, help="milliseconds after a pass to count the CPU of")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--passes", type=int, default=10, help="passes per setting, idle length and round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--markdown", type=Path, metavar="JSON", help="print the table of a record and exit")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "lone_pass.json")
    args = parser.parse_args(argv)
    if args.markdown:
        print(table(json.loads(args.markdown.read_text(encoding="utf-8"))))
        return 0
    if not args.bundles:
        parser.error("name at least one bundle")
    result: dict[str, Any] = {"machine": machine_facts(args.threads, ("onnxruntime", "numpy")),
                              "started_load_average": list(os.getloadavg()),
                              "args": {"idle_ms": args.idle, "after_ms": args.after, "rounds": args.rounds,
                                       "passes": args.passes, "threads": args.threads, "inputs": args.input},
                              "rows": []}
    for folder in args.bundles:
        result["rows"] += measure(folder, args.input, args.idle, args.after, args.rounds, args.passes, args.threads)
        write_record(args.out, result)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
