"""The service's memory model, measured: idle RSS per model, and what the heaviest valid requests add.

Starts `berth serve` on a model repository with the service's default limits (nothing set but the port), reads
its idle RSS from /proc, then for each route sends `--concurrency` copies at once of the heaviest request the
default limits accept for it (the most inputs and tokens that pass max_inputs_per_request,
max_tokens_per_request and max_response_bytes), sampling the server's RSS every 10 ms: the peak growth is what
that many such requests cost at once. Token vectors (the largest answers) are sent 8 at once, as many as
max_inflight_response_bytes holds; last, every route's heaviest request, `--concurrency` copies each, all at
once. A request the limits refuse is reported with its status (the figure then is what a refusal costs).
Writes JSON with the machine facts and prints a table.

    python -m bench.memory --models models --out bench/results/memory-defaults.json
    python -m bench.memory --models /tmp/repo --only sentiment,embeddings --concurrency 4
    python -m bench.memory --table bench/results/memory-defaults.json    # the markdown table of a run

`--idle` compares the sessions' memory settings (BERTH_ORT_SHARED_MEMORY false: a copy of the weights and
an arena per ONNX Runtime session, as before; true: shared, with or without BERTH_ORT_PREPACK_WEIGHTS; shared
with BERTH_PARALLEL_PASSES=1, no narrow second session per model) in one run, or only those named by
`--policy`: the idle RSS of a server with the first model alone and with all of them, the growth per
additional model, and, with `--peak`, the RSS peak while `--concurrency` copies of every model's heaviest
request run at once:

    python -m bench.memory --models models --idle --peak --out bench/results/memory-idle.json
    python -m bench.memory --models models --idle --policy shared --only topics,similarity   # one model vs two
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from bench.local_processes import REPO, free_port, running, serve_repository
from bench.machine import machine_facts

SQUAD_SAMPLE = REPO / "data" / "samples" / "squad" / "dev.json"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def paragraphs() -> list[str]:
    data = json.loads(SQUAD_SAMPLE.read_text(encoding="utf-8"))
    return [p["context"] for article in data["data"] for p in article["paragraphs"]]


def text_of(words: int, shift: int) -> str:
    """Real English text of about `words` words (SQuAD paragraphs joined)."""
    pool = " ".join(paragraphs()[shift % 50:] + paragraphs()[: shift % 50]).split()
    return " ".join(pool[:words])


def _texts(max_seq_length: int) -> list[str]:
    """As many inputs near max_seq_length (~1.3 tokens a word) as 256 inputs and 32,768 tokens allow."""
    count = min(256, 32_768 // max_seq_length)
    return [text_of(int(max_seq_length * 0.7), i) for i in range(count)]


def _halves(text: str) -> dict[str, str]:
    return {"text": text[: len(text) // 2], "text_pair": text[len(text) // 2:]}


def _masked(texts: list[str]) -> list[str]:
    return [" ".join(t.split()[:60]) + " " + " ".join(["[MASK]"] * 16) + "." for t in texts[:128]]


class Heavy(NamedTuple):
    """One of a task's heaviest requests: its name in the table, the (route, body) for a model's max_seq_length,
    and how many copies run at once (None: --concurrency)."""

    name: str
    build: Callable[[int], tuple[str, dict[str, Any]]]
    at_once: int | None = None


# Per task, the heaviest bodies the default limits accept (256 inputs, 32,768 tokens a request, 32 MiB of answer).
# A workload table, data: what is heaviest differs per task (windows for NER and QA, [MASK] count, choices).
HEAVIEST: dict[str, tuple[Heavy, ...]] = {
    "classification": (Heavy("classification", lambda n: ("/v1/classify", {"inputs": _texts(n)})),),
    "pair": (Heavy("pair", lambda n: ("/v1/pair", {"inputs": [_halves(t) for t in _texts(n)]})),),
    "embedding": (
        Heavy("embedding", lambda n: ("/v1/embed", {"inputs": _texts(n)})),
        # per-token vectors: the largest answers a default server gives (~30 MiB); as many at once as
        # max_inflight_response_bytes holds
        Heavy("embedding-tokens", lambda n: ("/v1/embed", {"inputs": [text_of(int(n * 0.6), i) for i in range(16)],
                                                           "output": "tokens", "layers": [-1]}), at_once=8),
    ),
    # one window each
    "ner": (Heavy("ner", lambda n: ("/v1/ner", {"inputs": [text_of(int(n * 0.6), i)
                                                           for i in range(len(_texts(n)))]})),),
    # 6 contexts of ~2,600 tokens: ~26,000 tokens in windows
    "qa": (Heavy("qa", lambda n: ("/v1/qa", {"inputs": [{"question": "When was it founded?",
                                                         "context": text_of(2000, i)} for i in range(6)],
                                             "top_k": 20})),),
    "fill-mask": (Heavy("fill-mask", lambda n: ("/v1/fill-mask", {"inputs": _masked(_texts(n)), "top_k": 5})),),
    "multiple-choice": (Heavy("multiple-choice", lambda n: ("/v1/choice", {"inputs": [
        {"context": t[:300], "choices": [t[300:400] + str(k) for k in range(8)]}
        for t in _texts(n)[: 32_768 // 128 // 8]]})),),
}


def heaviest(task: str, max_seq_length: int) -> tuple[str, dict[str, Any]] | None:
    """The route and the heaviest body of a model of `task` (the first of its table entry; None: not in it)."""
    entries = HEAVIEST.get(task)
    return entries[0].build(max_seq_length) if entries else None


def post(port: int, route: str, body: dict[str, Any]) -> tuple[int, int, str]:
    """(status, answer bytes, error message or "")."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{route}", data=json.dumps(body).encode("utf-8"),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, len(response.read()), ""
    except urllib.error.HTTPError as error:
        text = error.read()
        return error.code, len(text), text.decode("utf-8", "replace")[:300]


def measure(port: int, pid: int, route: str, body: dict[str, Any], concurrency: int) -> dict[str, Any]:
    return measure_all(port, pid, [(route, body)], concurrency)


def measure_all(port: int, pid: int, plans: list[tuple[str, dict[str, Any]]], concurrency: int) -> dict[str, Any]:
    """`concurrency` copies of each (route, body) sent at once, RSS sampled every 10 ms."""
    for route, body in plans:
        post(port, route, {**body, "inputs": body["inputs"][:2]})  # this route's shapes seen once
    before = rss_bytes(pid)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes(pid))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.perf_counter()
    jobs = [plan for plan in plans for _ in range(concurrency)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda plan: post(port, *plan), jobs))
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    after = rss_bytes(pid)
    return {"route": " + ".join(route for route, _ in plans), "inputs": sum(len(b["inputs"]) for _, b in plans),
            "concurrency": concurrency,
            "status": sorted({status for status, _, _ in answers}), "answer_bytes": max(size for _, size, _ in answers),
            "errors": sorted({error for _, _, error in answers if error}),
            "rss_before_mib": before / 2**20, "rss_peak_growth_mib": (peak[0] - before) / 2**20,
            "rss_after_growth_mib": (after - before) / 2**20, "seconds": seconds}


def record(result: dict[str, Any], row: dict[str, Any]) -> None:
    result["rows"].append(row)
    print(f"{row['model']:12s} {row['task']:18s} {row['inputs']:4d} inputs x{row['concurrency']}: "
          f"status {row['status']}, answer {row['answer_bytes'] / 2**20:6.2f} MiB, "
          f"RSS peak +{row['rss_peak_growth_mib']:.0f} MiB, after +{row['rss_after_growth_mib']:.0f} MiB, "
          f"{row['seconds']:.1f} s {' '.join(row['errors'])[:200]}", flush=True)


def markdown(result: dict[str, Any]) -> str:
    """The run as a markdown table (docs/SERVICE.md's is made from a run's JSON by `--table FILE`)."""
    machine = result["machine"]
    lines = [f"Idle RSS with {len(result['models'])} model(s): {result['idle_rss_mib']:.0f} MiB "
             f"({machine['cpu_model']}, {machine['usable_cores']} cores, revision {machine['git_revision'][:8]}).", "",
             "| model | task | route | inputs a request | at once | status | answer | RSS peak growth | RSS after |",
             "|---|---|---|---:|---:|---|---:|---:|---:|"]
    for row in result["rows"]:
        lines.append(f"| {row['model']} | {row['task']} | `{row['route']}` | {row['inputs']} | {row['concurrency']} | "
                     f"{', '.join(map(str, row['status']))} | {row['answer_bytes'] / 2**20:.2f} MiB | "
                     f"+{row['rss_peak_growth_mib']:.0f} MiB | +{row['rss_after_growth_mib']:.0f} MiB |")
    return "\n".join(lines)


POLICIES = {  # the sessions' memory settings compared by --idle
    "per-session": {"BERTH_ORT_SHARED_MEMORY": "false"},
    "shared": {"BERTH_ORT_SHARED_MEMORY": "true", "BERTH_ORT_PREPACK_WEIGHTS": "true"},
    "shared, not prepacked": {"BERTH_ORT_SHARED_MEMORY": "true", "BERTH_ORT_PREPACK_WEIGHTS": "false"},
    # the default, without the narrow second session of each model (one pass at a time per model)
    "shared, one session": {"BERTH_ORT_SHARED_MEMORY": "true", "BERTH_ORT_PREPACK_WEIGHTS": "true",
                            "BERTH_PARALLEL_PASSES": "1"},
    "shared, not prepacked, one session": {"BERTH_ORT_SHARED_MEMORY": "true", "BERTH_ORT_PREPACK_WEIGHTS": "false",
                                           "BERTH_PARALLEL_PASSES": "1"},
}


def idle_server(repository: Path, names: list[str], policy: str, threads: int, work: Path, extra: list[str]):
    import os
    import sys

    port = free_port()
    command = [sys.executable, "-m", "berth.cli", "serve", "--models", str(repository), "--port", str(port),
               "--threads", str(threads), "--log-level", "warning", *extra,
               *[arg for n in names for arg in ("--model", n)]]
    env = {**os.environ, **POLICIES[policy]}
    tag = policy.replace(", ", "-").replace(" ", "-")
    return port, running(command, port, work / f"idle-{tag}-{len(names)}.log", env=env)


def settled_rss(pid: int, seconds: float = 3.0) -> float:
    """RSS in MiB once the server is ready and has been left alone `seconds`."""
    time.sleep(seconds)
    return rss_bytes(pid) / 2**20


def idle_comparison(args: argparse.Namespace, bundles: dict[str, Any], names: list[str], work: Path
                    ) -> dict[str, Any]:
    """Every policy, one after the other in this run: idle RSS with names[0] alone and with all of `names`;
    with
    --peak, the peak while every model's heaviest request runs --concurrency times at once."""
    extra = ["--request-timeout", str(args.request_timeout)]
    rows = []
    for policy in args.policies:
        row: dict[str, Any] = {"policy": policy, "models": len(names)}
        started = time.perf_counter()
        port, server = idle_server(args.models, names[:1], policy, args.threads, work, extra)
        with server as proc:
            row["ready_seconds_first"] = time.perf_counter() - started
            row["idle_first_mib"] = settled_rss(proc.pid)
        started = time.perf_counter()
        port, server = idle_server(args.models, names, policy, args.threads, work, extra)
        with server as proc:
            row["ready_seconds_all"] = time.perf_counter() - started
            row["idle_all_mib"] = settled_rss(proc.pid)
            if args.peak:
                plans = []
                for name in names:
                    spec = bundles[name].spec()
                    plan = heaviest(spec.task, spec.max_seq_length)
                    if plan is not None:
                        plans.append((plan[0], {**plan[1], "model": name}))
                row["peak"] = measure_all(port, proc.pid, plans, args.concurrency)
                row["after_load_mib"] = settled_rss(proc.pid)
        growth = row["idle_all_mib"] - row["idle_first_mib"]
        row["per_additional_model_mib"] = growth / max(1, len(names) - 1)
        rows.append(row)
        print(f"{policy:12s} idle {names[0]} alone {row['idle_first_mib']:.0f} MiB, all {len(names)} "
              f"{row['idle_all_mib']:.0f} MiB, +{row['per_additional_model_mib']:.0f} MiB a model"
              + (f", peak +{row['peak']['rss_peak_growth_mib']:.0f} MiB (status {row['peak']['status']})"
                 if "peak" in row else ""), flush=True)
    return {"idle": rows}


def idle_markdown(result: dict[str, Any]) -> str:
    machine = result["machine"]
    models = result["models"]
    lines = [f"{len(models)} models ({', '.join(models)}) from {result['repository']}; "
             f"{machine['cpu_model']}, "
             f"{machine['usable_cores']} cores, revision {machine['git_revision'][:8]}.", "",
             f"| sessions' memory | idle, {models[0]} alone | idle, all {len(models)} "
             "| each additional model "
             "| peak during the heaviest requests | ready in (all) |", "|---|---:|---:|---:|---:|---:|"]
    for row in result["idle"]:
        peak = row.get("peak")
        peak_text = (f"{row['idle_all_mib'] + peak['rss_peak_growth_mib']:.0f} MiB "
                     f"(+{peak['rss_peak_growth_mib']:.0f}, {peak['inputs']} inputs x{peak['concurrency']}, "
                     f"status {', '.join(map(str, peak['status']))})") if peak else "-"
        lines.append(f"| {row['policy']} | {row['idle_first_mib']:.0f} MiB | {row['idle_all_mib']:.0f} MiB | "
                     f"{row['per_additional_model_mib']:.0f} MiB | {peak_text} | "
                     f"{row['ready_seconds_all']:.0f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from tasks.bundle_checks import load_bundle
    from tasks.runtime.bundle import find_bundles

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, help="print the markdown table of a run's JSON and stop")
    parser.add_argument("--models", type=Path, help="a model repository (folder of bundles)")
    parser.add_argument("--only", default="", help="comma-separated bundle names (default: all)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--idle", action="store_true", help="compare memory settings (idle RSS)")
    parser.add_argument("--peak", action="store_true", help="with --idle: the heaviest requests' peak")
    parser.add_argument("--policy", dest="policies", action="append", choices=sorted(POLICIES),
                        help="with --idle: only this memory setting (repeatable; default: every one)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "memory.json")
    args = parser.parse_args(argv)
    if args.table is not None:
        run = json.loads(args.table.read_text(encoding="utf-8"))
        print(idle_markdown(run) if "idle" in run else markdown(run))
        return 0
    if args.models is None:
        parser.error("--models is required (or --table FILE)")
    args.policies = args.policies or list(POLICIES)

    bundles = {b.name: load_bundle(b) for b in find_bundles(args.models)}
    names = [n for n in args.only.split(",") if n] or sorted(bundles)
    result: dict[str, Any] = {"machine": machine_facts(args.threads), "repository": str(args.models),
                              "models": names, "rows": []}
    work = Path(tempfile.mkdtemp(prefix="berth-memory-"))  # the servers' logs, for when one fails
    print(f"server logs in {work}", flush=True)
    if args.idle:
        result.update(idle_comparison(args, bundles, names, work))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(idle_markdown(result))
        print(f"written {args.out}")
        return 0
    # the default limits, but time enough for --concurrency of the heaviest requests on a small machine
    serve_args = [arg for n in names for arg in ("--model", n)] + ["--request-timeout", str(args.request_timeout)]
    port, server = serve_repository(args.models, args.threads, work, serve_args)
    with server as proc:
        time.sleep(2)
        result["idle_rss_mib"] = rss_bytes(proc.pid) / 2**20
        print(f"idle RSS with {len(names)} model(s): {result['idle_rss_mib']:.0f} MiB")
        everything = []
        for name in names:
            spec = bundles[name].spec()
            for heavy in HEAVIEST.get(spec.task, ()):
                route, body = heavy.build(spec.max_seq_length)
                plan = (route, {**body, "model": name})
                everything.append(plan)
                at_once = heavy.at_once or args.concurrency
                record(result, {"model": name, "task": heavy.name, **measure(port, proc.pid, *plan, at_once)})
        record(result, {"model": "all", "task": "every route at once",
                        **measure_all(port, proc.pid, everything, args.concurrency)})
        result["rss_end_mib"] = rss_bytes(proc.pid) / 2**20
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown(result))
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
