"""The serving ceiling, measured in one run: what berth could reach on these cores, and its share of it.

On a machine whose cores the load generator shares with the server, the raw engine's best batch is not reachable
over HTTP: the generator, the kernel's loopback and an HTTP parser take their share of the same cores. So, per
bundle and input (short and long), in one run on the same cores:

(a) **the engine**: ONNX Runtime on the bundle, each pass *including* the tokenization of its inputs (the task's
    own `prepare_many` of B copies of the request's input, padded, run): batch-1 latency and the best requests/s
    over batch sizes, one pass on every thread or one single-thread pass per thread side by side;
(b) **a do-nothing ASGI app** (reads the body, answers a fixed JSON) under uvicorn with httptools and uvloop, as
    `berth serve` runs, under the same `hey` load and client count;
(c) **berth serve** on the same bundles under the same load (once per `--berth` code tree: before and after a
    change side by side; with `--rounds N`, N windows each, the trees taking turns, and the median window kept:
    on a shared machine one window of each does not separate a change of a few percent). With `--rounds N` and
    more than one client, the engine's best batch is also measured again before every round, and the ceiling
    takes the median of those N windows: the best of the scan is the highest of ten noisy windows, a ceiling
    biased upwards against a median of berth's.
(d) with more than one client, **the do-nothing app again, paced at berth's rate** (the fastest tree's median
    window, spread over the same connections with hey's per-connection rate limit): the event loop CPU that
    HTTP alone costs a request at berth's rate, so that berth's own share of its event loop (the app, its
    tokenizing, its extra wake-ups) reads as the difference. At its own full rate the do-nothing server
    handles many requests per wake-up of the loop; at berth's rate it does not.

Both (a) and (b) fill the cores: at R_engine and R_http requests/s a request costs 1/R_engine and 1/R_http of the
machine, so the ceiling with both on the same cores is 1 / (1/R_engine + 1/R_http) requests/s; at one client the
latency floor is the engine's batch-1 time plus the do-nothing server's p50 (the HTTP round trip).

    python -m bench.serving_ceiling --models classify=/tmp/repo/int8/sentiment ner=/tmp/repo/int8/entities \
        --berth before=/tmp/berth-before after=. --clients 1 32 --seconds 8 --out bench/results/serving_ceiling.json
    python -m bench.serving_ceiling --markdown bench/results/serving_ceiling.json

Writes the JSON (machine facts, CPU flags, every level) and prints the table (docs/SERVICE.md's).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from bench.load_tools import hey, hey_version, machine_cpu, steal_share
from bench.local_processes import REPO, free_port, running
from bench.machine import machine_facts
from bench.records import read_record, write_record
from bench.service_load import SHARED_DATA, side_by_side, workloads
from tasks.registry import definition

LIBRARIES = ("onnxruntime", "tokenizers", "fastapi", "uvicorn", "uvloop", "httptools", "numpy")
# the workloads by task: (short, long), from bench/service_load.py's real dev inputs (NER long: CoNLL sentences
# joined to ~120 tokens)
INPUTS = {"classification": ("classify-short", "classify-long"), "ner": ("ner", "ner-long")}


async def null_app(scope: dict, receive: Any, send: Any) -> None:
    """The do-nothing ASGI app: reads the request's body, answers a small fixed JSON (GET: only `/`, for the
    readiness wait)."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    found = scope["method"] == "POST" or scope["path"] == "/"
    await send({"type": "http.response.start", "status": 200 if found else 404,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"11")]})
    await send({"type": "http.response.body", "body": b'{"ok":true}'})


def ner_long(tokenizer) -> str:
    from tasks import readers

    sentences = [" ".join(e.tokens) for e in readers.read_conll(SHARED_DATA / "conll2003" / "iob2" / "valid.txt")]
    words = " ".join(s for s in sentences[:40] if len(s.split()) > 5).split()
    while len(tokenizer.encode(" ".join(words)).ids) > 120:
        words = words[:-2]
    return " ".join(words)


def request_bodies(tokenizer) -> dict[str, dict[str, Any]]:
    loads = workloads(tokenizer)
    bodies = {name: loads[name]["body"] for names in INPUTS.values() for name in names if name in loads}
    bodies["ner-long"] = {"inputs": ner_long(tokenizer)}
    return bodies


# -- (a) the engine, tokenization included ---------------------------------------------------------------------


def engine_with_tokenization(bundle: Any, tokenizer: Any, raw: str, threads: int, batch_sizes: list[int],
                             seconds: float) -> tuple[dict[str, Any], Callable[[], float]]:
    """The engine's rows by batch size, and a function that measures its best one (batch and way) once more:
    the best of a scan is the highest of several noisy windows, so with `--rounds` each round measures it again
    and the ceiling takes the median of those windows."""
    from tasks.runtime.batching import pad_batch
    from tasks.runtime.onnx_session import create_session

    task = definition(bundle.task)
    spec, options = bundle.spec(), task.options()
    wide = create_session(bundle.model_path, bundle.precision, threads, prefer_gpu=False)[0]
    narrow = create_session(bundle.model_path, bundle.precision, 1, prefer_gpu=False)[0]

    def one_pass(session: Any, batch: int) -> None:
        prepared = task.prepare_many(tokenizer, spec, [raw] * batch, options)
        session.run(None, pad_batch([item for p in prepared for item in p.items]))

    rows = []
    for batch in batch_sizes:
        one_pass(wide, batch)
        latencies, begin = [], time.perf_counter()
        while time.perf_counter() - begin < seconds or len(latencies) < 3:
            start = time.perf_counter()
            one_pass(wide, batch)
            latencies.append(time.perf_counter() - start)
        p50 = float(np.median(latencies))
        passes, wall = side_by_side(functools.partial(one_pass, narrow, batch), threads, seconds)
        rows.append({"batch": batch, "one_pass_p50_ms": 1000 * p50, "one_pass_requests_per_s": batch / p50,
                     "side_by_side_requests_per_s": batch * passes / wall})
    best = max(rows, key=lambda r: max(r["one_pass_requests_per_s"], r["side_by_side_requests_per_s"]))
    beside = best["side_by_side_requests_per_s"] >= best["one_pass_requests_per_s"]

    def again(batch: int = best["batch"]) -> float:
        if beside:
            passes, wall = side_by_side(functools.partial(one_pass, narrow, batch), threads, seconds)
            return batch * passes / wall
        count, begin = 0, time.perf_counter()
        while time.perf_counter() - begin < seconds or count < 3:
            one_pass(wide, batch)
            count += 1
        return batch * count / (time.perf_counter() - begin)

    return {"batch1_p50_ms": rows[0]["one_pass_p50_ms"] if rows[0]["batch"] == 1 else None,
            "best_requests_per_s": max(best["one_pass_requests_per_s"], best["side_by_side_requests_per_s"]),
            "best_batch": best["batch"], "best_side_by_side": beside, "rows": rows}, again


def engine_rate(row: dict[str, Any]) -> float:
    """The engine's requests/s a row's ceiling uses: the median of its best batch measured again round by round
    (`engine_rounds`), else the best of the scan."""
    again = row.get("engine_rounds")
    return float(np.median(again)) if again else row["engine"]["best_requests_per_s"]


# -- (b) and (c): servers under hey ----------------------------------------------------------------------------


def null_server(work: Path):
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "bench.serving_ceiling:null_app", "--host", "127.0.0.1", "--port",
               str(port), "--http", "httptools", "--loop", "uvloop", "--no-access-log", "--log-level", "warning",
               "--lifespan", "off"]
    return port, running(command, port, work / "null.log", ready_path="/")


def berth_server(tree: str, repository: Path, threads: int, work: Path, label: str, extra: list[str]):
    """`berth serve` from the code tree `tree`: CODE[,VARIABLE=VALUE...] (BERTH_* settings for this server)."""
    code, *variables = tree.split(",")
    port = free_port()
    command = [sys.executable, "-m", "berth.cli", "serve", "--models", str(repository), "--port", str(port),
               "--threads", str(threads), "--log-level", "warning", *extra]
    env = {**os.environ, "PYTHONPATH": str(Path(code).resolve()), **dict(v.split("=", 1) for v in variables)}
    return port, running(command, port, work / f"serve-{label}.log", cwd=Path(code).resolve(), env=env)


def ceiling(engine: dict[str, Any], null: dict[str, Any], clients: int, engine_per_s: float | None = None
            ) -> dict[str, float]:
    """What the engine and the HTTP floor leave together on the same cores (the module says how); `engine_per_s`:
    the engine's rate to use instead of its scan's best."""
    if clients == 1:
        floor_ms = engine["batch1_p50_ms"] + null["p50_ms"]
        return {"requests_per_s": 1000 / floor_ms, "p50_ms": floor_ms}
    rate = engine["best_requests_per_s"] if engine_per_s is None else engine_per_s
    return {"requests_per_s": 1 / (1 / rate + 1 / null["requests_per_s"])}


def main(argv: list[str] | None = None) -> int:
    from tasks.bundle_checks import load_bundle
    from tasks.runtime.tokenizer import load_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", type=Path, metavar="JSON", help="print the table of a result file and exit")
    parser.add_argument("--models", nargs="+", metavar="NAME=BUNDLE", default=[],
                        help="bundles (classification or NER) to measure, each named")
    parser.add_argument("--berth", nargs="+", default=[f"this={REPO}"], metavar="LABEL=CODE[,VAR=VALUE...]",
                        help="berth code trees to serve the bundles from (with BERTH_* settings of their own), each "
                             "measured right after the other at every level")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per load level")
    parser.add_argument("--rounds", type=int, default=1,
                        help="windows per code tree and level, the trees taking turns (the table shows each tree's "
                             "median window, and with more than one, every window's requests/s and event loop CPU)")
    parser.add_argument("--engine-seconds", type=float, default=1.5, help="seconds per engine batch size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--serve-arg", action="append", default=[], help="extra `berth serve` flag (repeatable)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "serving_ceiling.json")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(read_record(args.markdown)))
        return 0
    if shutil.which("hey") is None:
        parser.error("needs `hey` on PATH (apt-get install hey)")
    bundles = {name: load_bundle(Path(path)) for name, path in (m.split("=", 1) for m in args.models)}
    trees = dict(t.split("=", 1) for t in args.berth)
    work = Path(tempfile.mkdtemp(prefix="berth-ceiling-"))
    repository = work / "repository"
    repository.mkdir()
    for name, bundle in bundles.items():
        (repository / name).symlink_to(bundle.path.resolve())
    result: dict[str, Any] = {"machine": machine_facts(args.threads, LIBRARIES), "hey": hey_version(),
                              "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                              "started_load_average": os.getloadavg(), "rows": []}
    start_cpu = machine_cpu()
    with ExitStack() as stack:
        port, null_context = null_server(work)
        null_proc = stack.enter_context(null_context)
        servers = {}
        for label, tree in trees.items():
            served_port, context = berth_server(tree, repository, args.threads, work, label, args.serve_arg)
            servers[label] = (served_port, stack.enter_context(context))
        for name, bundle in bundles.items():
            tokenizer = load_tokenizer(bundle.tokenizer_path)
            bodies = request_bodies(tokenizer)
            route = definition(bundle.task).route
            for input_name in INPUTS[bundle.task]:
                body = {**bodies[input_name], "model": name}
                engine, engine_again = engine_with_tokenization(bundle, tokenizer, body["inputs"], args.threads,
                                                                args.batch_sizes, args.engine_seconds)
                tokens = len(tokenizer.encode(body["inputs"]).ids)
                print(f"{name} {input_name} ({tokens} tokens): engine+tokenize batch-1 "
                      f"{engine['batch1_p50_ms']:.2f} ms, best {engine['best_requests_per_s']:.1f} req/s "
                      f"at {engine['best_batch']}", flush=True)
                for clients in args.clients:
                    null = hey(port, route, body, clients, args.seconds, null_proc.pid, work)
                    row = {"model": name, "precision": bundle.precision, "input": input_name, "tokens": tokens,
                           "clients": clients, "engine": engine, "null": null, "berth": {}}
                    rounds: dict[str, list[dict[str, Any]]] = {label: [] for label in servers}
                    again = clients > 1 and args.rounds > 1
                    if again:
                        row["engine_rounds"] = []
                    for round_ in range(args.rounds):  # the trees in turn, the order reversed every other round
                        if again:  # the engine's best batch once more, in the same stretch of time as the windows
                            row["engine_rounds"].append(engine_again())
                        for label in list(servers) if round_ % 2 == 0 else list(reversed(servers)):
                            served_port, proc = servers[label]
                            rounds[label].append(hey(served_port, route, body, clients, args.seconds, proc.pid, work))
                    row["ceiling"] = ceiling(engine, null, clients, engine_rate(row))
                    for label, measured in rounds.items():
                        row["berth"][label] = median_round(measured)
                    if args.rounds > 1:
                        row["berth_rounds"] = rounds
                    if clients > 1:
                        fastest = max(level["requests_per_s"] for level in row["berth"].values())
                        row["null_paced"] = hey(port, route, body, clients, args.seconds, null_proc.pid, work,
                                                rate_per_client=round(fastest / clients, 2))
                    result["rows"].append(row)
                    print(markdown_row(row, list(trees)), flush=True)
                    write_record(args.out, result)
    result["steal_share"] = steal_share(start_cpu, machine_cpu())
    result["ended_load_average"] = os.getloadavg()
    write_record(args.out, result)
    print(markdown(result))
    return 0


def median_round(measured: list[dict[str, Any]]) -> dict[str, Any]:
    """The window with the median requests/s (the lower middle one of an even count)."""
    return sorted(measured, key=lambda level: level["requests_per_s"])[(len(measured) - 1) // 2]


HEADER = ("| model | precision | input (tokens) | clients | engine+tokenize: best req/s (batch) / batch-1 ms | "
          "do-nothing HTTP: req/s / p50 ms | ceiling req/s | berth | req/s | share of ceiling | share of engine | "
          "p50 ms (overhead over engine batch-1) | p99/p50 |")


def markdown_row(row: dict[str, Any], labels: list[str]) -> str:
    """A row per tree. With `engine_rounds`, the engine column reads "median of the rounds (the scan's best)"."""
    engine, null, top = row["engine"], row["null"], row["ceiling"]["requests_per_s"]
    rate = engine_rate(row)
    scan = f" (scan {engine['best_requests_per_s']:.0f})" if row.get("engine_rounds") else ""
    lines = []
    for label in labels:
        served = row["berth"][label]
        p50, p99 = served["p50_ms"] or float("nan"), served["p99_ms"] or float("nan")
        lines.append(
            f"| {row['model']} | {row['precision']} | {row['input']} ({row['tokens']}) | {row['clients']} | "
            f"{rate:.0f}{scan} ({engine['best_batch']}) / {engine['batch1_p50_ms']:.2f} | "
            f"{null['requests_per_s']:.0f} / {null['p50_ms']:.2f} | {top:.0f} | {label} | "
            f"{served['requests_per_s']:.0f} | {served['requests_per_s'] / top:.2f} | "
            f"{served['requests_per_s'] / rate:.2f} | "
            f"{p50:.2f} ({p50 - engine['batch1_p50_ms']:+.2f}) | {p99 / p50:.2f} |")
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    machine = result["machine"]
    labels = list(result["rows"][0]["berth"]) if result["rows"] else []
    lines = [f"{machine.get('cpu_model', '?')}, {machine.get('logical_cores', '?')} cores, flags "
             f"{', '.join(machine.get('cpu_flags', [])) or 'none of the listed'}; load average at start "
             f"{result['started_load_average'][0]:.2f}; steal {result.get('steal_share', 0):.1%}", "",
             HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    lines += [markdown_row(row, labels) for row in result["rows"]]
    if any("berth_rounds" in row for row in result["rows"]):
        lines += ["", "| model | input | clients | berth | req/s, window by window | event loop CPU ms per request |",
                  "|---|---|---|---|---|---|"]
        for row in result["rows"]:
            for label, windows in row.get("berth_rounds", {}).items():
                rates = ", ".join(f"{w['requests_per_s']:.0f}" for w in windows)
                loop = ", ".join(f"{w['event_loop_cpu_ms_per_request']:.2f}" for w in windows)
                lines.append(f"| {row['model']} | {row['input']} | {row['clients']} | {label} | {rates} | {loop} |")
    paced = [row for row in result["rows"] if "null_paced" in row]
    if paced:
        lines += ["", "| model | input | clients | do-nothing HTTP paced at berth's rate: req/s | its event loop CPU "
                  "ms per request | berth | berth's event loop CPU ms per request | berth's own (the difference) |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in paced:
            null = row["null_paced"]
            for label, served in row["berth"].items():
                own = served["event_loop_cpu_ms_per_request"] - null["event_loop_cpu_ms_per_request"]
                lines.append(f"| {row['model']} | {row['input']} | {row['clients']} | {null['requests_per_s']:.0f} | "
                             f"{null['event_loop_cpu_ms_per_request']:.3f} | {label} | "
                             f"{served['event_loop_cpu_ms_per_request']:.3f} | {own:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
