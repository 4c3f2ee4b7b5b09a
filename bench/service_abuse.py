"""How the server holds up under one abusive client, and what a request costs it: before/after figures.

Runs a real `berth serve` (from this checkout, or from another one with --code, to compare with an older
revision on the same bundles) on 127.0.0.1 and measures, one after the other:
1. **overhead**: sequential one-sentence /v1/classify requests on an idle server: client latency and
   the server's own stages (`x-*-time` headers, and `Server-Timing` where the server sends it); the
   overhead is total minus inference;
2. **small under huge**: one-sentence /v1/qa requests sent every 0.25 s while another client's request
   of five ~30,000-character contexts is processed: their latency next to the huge request's;
3. **event-loop lag**: GET /healthz probes (a no-op) back to back while 100,000-character /v1/ner
   requests are tokenized and decoded: probe latency p50 / p99 / max;
4. **decoding memory**: peak RSS growth of the server process (VmHWM after resetting it through
   /proc/PID/clear_refs) for one /v1/qa request over a ~100,000-character context at max_answer_length
   64 (and 512 where the server accepts it).

The bundles are the service tests' (BERTH_TEST_REPOSITORY, built by `pytest tests/service`) or --models.
Limits are raised so the huge request is processed, not refused (the point is to see what it costs the
others). Prints a table and writes bench/results/service_abuse[-<label>].json with the machine facts.

    .venv/bin/python -m bench.service_abuse --models /tmp/svc_repo/repository --label after
    .venv/bin/python -m bench.service_abuse --models /tmp/svc_repo/repository --code /tmp/old --label before
    .venv/bin/python -m bench.service_abuse --table bench/results/service_abuse-before.json \
        bench/results/service_abuse-after.json                      # the table of docs/SERVICE_RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.filler_text import filler
from bench.local_processes import free_port
from bench.machine import machine_facts

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
ENV = {
    "BERTH_LENGTH_BUCKETS": "16,32,64,128", "BERTH_MAX_BATCH_TOKENS": "1024", "BERTH_MAX_BATCH_SIZE": "16",
    "BERTH_DEVICE": "cpu", "BERTH_MAX_QUEUE_ITEMS": "100000", "BERTH_MAX_CHARS_PER_REQUEST": "1000000",
    "BERTH_MAX_TOKENS_PER_REQUEST": "1000000", "BERTH_MAX_ITEMS_PER_REQUEST": "100000",
    "BERTH_REQUEST_TIMEOUT_S": "300",
}


def start_server(code: Path, models: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")} | ENV | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "berth.cli", "serve", "--models", str(models), "--port", str(port)],
                            cwd=code, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise RuntimeError("server not ready")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": pct(values, 50), "p99": pct(values, 99), "max": max(values)}


def server_timing(header: str | None) -> dict[str, float]:
    out = {}
    for part in (header or "").split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            out[name] = float(dur)
    return out


def overhead(url: str, requests: int) -> dict[str, Any]:
    text = "The acting, costumes, music and cinematography are all astounding."
    client_ms, stages = [], []
    with httpx.Client(base_url=url, timeout=30) as c:
        for i in range(requests + 10):
            begin = time.perf_counter()
            r = c.post("/v1/classify", json={"inputs": text})
            elapsed = (time.perf_counter() - begin) * 1000
            assert r.status_code == 200, r.text
            if i < 10:
                continue  # warm the connection and the shapes
            client_ms.append(elapsed)
            h = r.headers
            stage = {"total": float(h["x-total-time"]), "tokenize": float(h["x-tokenization-time"]),
                     "queue": float(h["x-queue-time"]), "inference": float(h["x-inference-time"])}
            stage.update({f"st_{k}": v for k, v in server_timing(h.get("server-timing")).items()})
            stages.append(stage)
    keys = stages[0].keys()
    medians = {k: statistics.median(s[k] for s in stages) for k in keys}
    return {"client_ms": summary(client_ms), "server_ms_median": medians,
            "overhead_ms_median": statistics.median(s["total"] - s["inference"] for s in stages),
            "client_minus_inference_ms_median": statistics.median(c - s["inference"]
                                                                  for c, s in zip(client_ms, stages))}


async def small_under_huge(url: str) -> dict[str, Any]:
    contexts = [filler(6000, 100 + i)[:30_000] + " The tower was built in 1901." for i in range(5)]
    huge = {"inputs": [{"question": "When was the tower built?", "context": c} for c in contexts]}
    small = {"inputs": {"question": "When was the bridge built?", "context": "The bridge was built in 1888."}}
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:
        begin = time.perf_counter()
        huge_task = asyncio.ensure_future(c.post("/v1/qa", json=huge))
        latencies, statuses = [], []
        await asyncio.sleep(0.5)  # the huge request is tokenized and queued by now
        while not huge_task.done() and len(latencies) < 40:
            t0 = time.perf_counter()
            r = await c.post("/v1/qa", json=small)
            latencies.append((time.perf_counter() - t0) * 1000)
            statuses.append(r.status_code)
            await asyncio.sleep(0.25)
        huge_response = await huge_task
        huge_ms = (time.perf_counter() - begin) * 1000
    return {"huge_status": huge_response.status_code, "huge_ms": huge_ms, "small_statuses": sorted(set(statuses)),
            "small_ms": summary(latencies) if latencies else None}


async def loop_lag(url: str, rounds: int) -> dict[str, Any]:
    text = filler(17000, 5)[:100_000]
    probes: list[float] = []
    big_ms = []
    async with httpx.AsyncClient(base_url=url, timeout=300) as c, httpx.AsyncClient(base_url=url, timeout=30) as p:
        for _ in range(rounds):
            t0 = time.perf_counter()
            task = asyncio.ensure_future(c.post("/v1/ner", json={"inputs": text}))
            while not task.done():
                b = time.perf_counter()
                await p.get("/healthz")
                probes.append((time.perf_counter() - b) * 1000)
            response = await task
            assert response.status_code == 200, response.text
            big_ms.append((time.perf_counter() - t0) * 1000)
        idle = []
        for _ in range(50):
            b = time.perf_counter()
            await p.get("/healthz")
            idle.append((time.perf_counter() - b) * 1000)
    return {"probe_ms_under_load": summary(probes), "probe_ms_idle": summary(idle), "big_request_ms": big_ms}


def peak_rss_growth(url: str, pid: int, max_answer_length: int) -> dict[str, Any]:
    context = filler(17000, 11)[:99_000] + " The observatory was founded in 1954."
    status = Path(f"/proc/{pid}/status")

    def field(name: str) -> int:
        for line in status.read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1])  # kB
        raise KeyError(name)

    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = field("VmRSS")
    r = httpx.post(url + "/v1/qa", timeout=300, json={"inputs": {"question": "When was the observatory founded?",
                                                                  "context": context},
                                                       "max_answer_length": max_answer_length})
    return {"max_answer_length": max_answer_length, "status": r.status_code,
            "peak_growth_mb": (field("VmHWM") - before) / 1024, "rss_before_mb": before / 1024}


def gil_hold(models: Path, rounds: int = 5) -> dict[str, Any]:
    """In-process, no HTTP: the longest gap of a thread that wakes every 1 ms while another thread builds
    the NER windows of a 100,000-character text, with `Tokenizer.encode` (holds the GIL for the whole call,
    the old service) and with the service's `GilFreeTokenizer` (`encode_batch`, which releases it)."""
    import threading

    from tasks import ner
    from tasks.runtime.tokenizer import GilFreeTokenizer, load_tokenizer

    plain = load_tokenizer(models / "entities" / "tokenizer.json")
    text = filler(17000, 5)[:100_000]

    def longest_gap(fn) -> tuple[float, float]:
        gaps: list[float] = []
        stop = threading.Event()

        def tick() -> None:
            last = time.perf_counter()
            while not stop.is_set():
                time.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = threading.Thread(target=tick)
        ticker.start()
        time.sleep(0.05)
        begin = time.perf_counter()
        fn()
        took = time.perf_counter() - begin
        stop.set()
        ticker.join()
        return took * 1000, max(gaps) * 1000

    out: dict[str, Any] = {}
    for name, tokenizer in (("encode", plain), ("encode_batch", GilFreeTokenizer(plain))):
        runs = [longest_gap(lambda t=tokenizer: ner.ner_windows(t, text, 64, 16)) for _ in range(rounds)]
        out[name] = {"windows_ms_median": statistics.median(r[0] for r in runs),
                     "longest_gap_ms_median": statistics.median(r[1] for r in runs)}
    return out


def markdown_table(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The before/after table of docs/SERVICE_RESULTS.md, from two result files."""
    def row(name: str, get) -> str:
        return f"| {name} | {get(before)} | {get(after)} |"

    def small(r: dict[str, Any]) -> str:
        s = r["small_under_huge"]
        return (f"p50 {s['small_ms']['p50']:,.0f} ms, max {s['small_ms']['max']:,.0f} ms "
                f"(huge: {s['huge_ms']:,.0f} ms)") if s["small_ms"] else "none sent"

    def rss(r: dict[str, Any], n: int) -> str:
        found = [x for x in r["rss"] if x["max_answer_length"] == n][0]
        return f"{found['peak_growth_mb']:.1f} MB" if found["status"] == 200 else f"refused ({found['status']})"

    lines = [f"| measure | before ({before['revision']}) | after ({after['revision']}) |", "|---|---|---|",
             row("idle one-sentence classify: client p50", lambda r: f"{r['overhead']['client_ms']['p50']:.1f} ms"),
             row("  server total − inference (p50)", lambda r: f"{r['overhead']['overhead_ms_median']:.2f} ms"),
             row("  of which queue (p50)", lambda r: f"{r['overhead']['server_ms_median']['queue']:.2f} ms"),
             row("  inference (p50)", lambda r: f"{r['overhead']['server_ms_median']['inference']:.2f} ms"),
             row("one-sentence QA while another client's 5 × 30,000-char request runs", small),
             row("/healthz probe during 100,000-char NER: p50 / p99 / max",
                 lambda r: "{p50:.1f} / {p99:.1f} / {max:.1f} ms".format(**r["loop_lag"]["probe_ms_under_load"])),
             row("  same probe, idle server: p99", lambda r: f"{r['loop_lag']['probe_ms_idle']['p99']:.1f} ms"),
             row("GIL held while building 100,000-char NER windows: longest 1 ms-ticker gap (median of 5)",
                 lambda r: f"{r['gil']['longest_gap_ms_median']:.1f} ms of {r['gil']['windows_ms_median']:.0f} ms"
                 if "gil" in r else "-"),
             row("peak RSS growth, QA over 99,000 chars, max_answer_length 64", lambda r: rss(r, 64)),
             row("  max_answer_length 512", lambda r: rss(r, 512))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                        help="print the markdown table of two result files and exit")
    parser.add_argument("--models", type=Path, default=Path(os.environ.get("BERTH_TEST_REPOSITORY", "/tmp/svc_repo"))
                        / "repository")
    parser.add_argument("--code", type=Path, default=REPO, help="checkout whose service to run (default: this one)")
    parser.add_argument("--label", default="", help="suffix of the result file (e.g. before / after)")
    parser.add_argument("--revision", default=None, help="git revision of --code when it is not a git checkout")
    parser.add_argument("--gil", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                        help="add the in-process GIL measurement (encode vs encode_batch) to two result files")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.gil:
        measured = gil_hold(args.models)
        for path, key in zip(args.gil, ("encode", "encode_batch")):
            result = json.loads(path.read_text())
            result["gil"] = measured[key]
            path.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(measured, indent=2))
        return 0
    if args.table:
        print(markdown_table(*(json.loads(path.read_text()) for path in args.table)))
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    revision = args.revision or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.code,
                                               capture_output=True, text=True).stdout.strip()
    log = RESULTS / f"service_abuse{'-' + args.label if args.label else ''}.log"
    proc, url = start_server(args.code, args.models, log)
    try:
        result: dict[str, Any] = {"revision": revision, "code": str(args.code), "models": str(args.models),
                                  "machine": machine_facts(), "env": ENV}
        result["overhead"] = overhead(url, args.requests)
        result["small_under_huge"] = asyncio.run(small_under_huge(url))
        result["loop_lag"] = asyncio.run(loop_lag(url, args.rounds))
        result["rss"] = [peak_rss_growth(url, proc.pid, n) for n in (64, 512)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    out = RESULTS / f"service_abuse{'-' + args.label if args.label else ''}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    o, s, lag = result["overhead"], result["small_under_huge"], result["loop_lag"]
    print(f"revision {revision} ({args.code})")
    print(f"| idle one-sentence classify | client p50 {o['client_ms']['p50']:.2f} ms | server total - inference "
          f"p50 {o['overhead_ms_median']:.2f} ms | inference {o['server_ms_median']['inference']:.2f} ms | "
          f"queue {o['server_ms_median']['queue']:.2f} ms |")
    if s["small_ms"]:
        print(f"| small QA under a huge one | small p50 {s['small_ms']['p50']:.0f} ms, max {s['small_ms']['max']:.0f} "
              f"ms ({s['small_ms']['n']} sent, status {s['small_statuses']}) | huge {s['huge_ms']:.0f} ms "
              f"(status {s['huge_status']}) |")
    print(f"| /healthz probe while 100k-char NER | p50 {lag['probe_ms_under_load']['p50']:.1f} ms, p99 "
          f"{lag['probe_ms_under_load']['p99']:.1f}, max {lag['probe_ms_under_load']['max']:.1f} "
          f"(idle p99 {lag['probe_ms_idle']['p99']:.1f}) |")
    for r in result["rss"]:
        print(f"| QA 99k chars, max_answer_length {r['max_answer_length']} | status {r['status']} | peak RSS growth "
              f"{r['peak_growth_mb']:.1f} MB |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
