"""Service load benchmark: berth's server under a concurrency sweep, next to its ceiling and its naive peer.

One run, side by side (GUIDE.md §4), on the same fine-tuned classification model:
1. the **raw engine** (ONNX Runtime on the bundle's model.onnx, in this process, no HTTP, no queue):
   batch sizes 1..64, ORT thread spinning on and off, texts in arrival order (the ceiling: the best of
   these) or all sorted by length first (an oracle no server can match: it needs every text in advance);
   the best batch-1 latency is the latency floor;
2. **berth serve** (a real server on 127.0.0.1, dynamic batching), with 1, 8, 32 and 128 concurrent
   clients each sending one text per request, back to back (closed loop), short and long texts; each
   1- and 32-client level is preceded by the engine figure it is compared with, measured right then,
   and repeated --rounds times (medians), so a neighbour's burst of load hits both sides of a ratio;
3. the **naive peer** (bench/naive_peer.py: FastAPI + a transformers pipeline, one forward per request)
   under the same sweep.
Each server runs alone (the other is stopped). Every level is bounded in time (--seconds) and count
(--max-requests) and stops by itself. The load generator is a minimal HTTP/1.1 client on asyncio streams
(keep-alive, pre-encoded requests), so it takes as little CPU as possible from the server it measures on
the same cores.

    .venv/bin/python -m bench.service_load                    # builds a model if needed, ~8 min
    .venv/bin/python -m bench.service_load --checkpoint <fine-tuned folder> --seconds 10
    .venv/bin/python -m bench.service_load --quick            # a smoke run, ~1 min

Prints a table and writes bench/results/service_load.json with the machine facts.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import machine_facts

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
SHARED_DATA = Path(os.environ.get("BERTH_SHARED_DATA", REPO.parent / "shared" / "data"))
LIBRARIES = ("onnxruntime", "fastapi", "uvicorn", "torch", "transformers", "tokenizers", "numpy")


# -- the model and the texts ---------------------------------------------------------------------------------


def prepare_model(work: Path, checkpoint: Path | None, precision: str, max_seq_length: int) -> tuple[Path, Path]:
    """(fine-tuned folder, model repository holding its bundle `model`). Without --checkpoint, one is made
    from the embedded base with a seeded head: speed does not depend on the head's values."""
    import torch

    from export.bundle_builder import export_bundle
    from tasks.spec import TaskSpec
    from training.checkpoint import default_base_path, load_pretrained, save_pretrained
    from training.model import BertForSequenceClassification

    if checkpoint is None:
        checkpoint = work / "checkpoint"
        if not (checkpoint / "config.json").is_file():
            torch.manual_seed(0)
            model, _ = load_pretrained(BertForSequenceClassification, default_base_path(),
                                       id2label={0: "negative", 1: "positive"})
            save_pretrained(model, checkpoint, tokenizer_from=default_base_path())
            TaskSpec(task="classification", labels=["negative", "positive"], max_seq_length=max_seq_length).save(
                checkpoint)
    repository = work / f"repository-{precision}"
    if not (repository / "model" / "bundle.json").is_file():
        export_bundle(checkpoint, repository / "model", precision=precision, parity_examples=16, threads=2)
    return checkpoint, repository


def load_texts(tokenizer, count: int = 400, long_tokens: int = 110) -> dict[str, list[str]]:
    """Short: real SST-2 dev sentences (or the shipped sample questions); long: consecutive ones joined
    to about `long_tokens` tokens."""
    sst2 = SHARED_DATA / "sst2" / "dev.tsv"
    if sst2.is_file():
        lines = sst2.read_text(encoding="utf-8").splitlines()[1:]
        short = [line.rsplit("\t", 1)[0].strip() for line in lines if line.strip()]
    else:
        sample = REPO / "data" / "samples" / "topic_questions" / "dev.jsonl"
        short = [json.loads(line)["text"] for line in sample.read_text(encoding="utf-8").splitlines() if line.strip()]
    short = short[:count]
    long, current = [], []
    for text in short * 4:
        current.append(text)
        if len(tokenizer.encode(" ".join(current)).ids) >= long_tokens:
            words = " ".join(current).split()
            while len(tokenizer.encode(" ".join(words)).ids) > long_tokens:
                words = words[:-3]
            long.append(" ".join(words))
            current = []
        if len(long) >= count // 2:
            break
    return {"short": short, "long": long}


def token_stats(tokenizer, texts: list[str]) -> dict[str, float]:
    lengths = [len(tokenizer.encode(t).ids) for t in texts]
    return {"texts": len(texts), "mean_tokens": float(np.mean(lengths)), "max_tokens": int(max(lengths))}


# -- 1. the raw engine ---------------------------------------------------------------------------------------


class Engine:
    """ONNX Runtime alone on the bundle's model, in this process, no HTTP and no queue.

    A configuration is (batch size, ORT thread spinning on/off, texts in arrival order or all sorted by
    length first); each batch is padded to its longest text. The ceiling is the best arrival-order
    configuration: a hand-written loop over this model taking texts as they come.
    """

    def __init__(self, repository: Path, threads: int):
        from tasks.bundle import load_bundle
        from tasks.onnx_session import create_session
        from tasks.tokenizer import load_tokenizer

        self.bundle = load_bundle(repository / "model")
        self.tokenizer = load_tokenizer(self.bundle.tokenizer_path)
        self.sessions = {}
        for spinning in (True, False):
            self.sessions[spinning], self.provider = create_session(
                self.bundle.model_path, self.bundle.precision, threads, prefer_gpu=False, allow_spinning=spinning)

    def measure(self, texts: list[str], batch: int, spinning: bool, length_sorted: bool, seconds: float
                ) -> dict[str, Any]:
        from tasks.batching import pad_batch
        from tasks.classification import encode_classification

        session = self.sessions[spinning]
        encoded = [encode_classification(self.tokenizer, t, max_length=self.bundle.spec().max_seq_length)
                   for t in texts]
        if length_sorted:
            encoded.sort(key=len)
        batches = [pad_batch(encoded[i : i + batch]) for i in range(0, len(encoded) - batch + 1, batch)]
        session.run(None, batches[0])  # warm up
        latencies, items, begin, k = [], 0, time.perf_counter(), 0
        while time.perf_counter() - begin < seconds or not latencies:
            feeds = batches[k % len(batches)]
            start = time.perf_counter()
            session.run(None, feeds)
            latencies.append(time.perf_counter() - start)
            items += feeds["input_ids"].shape[0]
            k += 1
        elapsed = time.perf_counter() - begin
        return {"batch": batch, "ort_spinning": spinning, "length_sorted": length_sorted,
                "items_per_s": items / elapsed, "batch_p50_ms": 1000 * float(np.median(latencies)),
                "batches": len(latencies)}

    def sweep(self, texts: list[str], batch_sizes: list[int], seconds: float) -> list[dict[str, Any]]:
        rows = []
        for batch in batch_sizes:
            for spinning in (True, False):
                for length_sorted in ((False,) if batch == 1 else (False, True)):
                    rows.append(self.measure(texts, batch, spinning, length_sorted, seconds))
        return rows

    def again(self, texts: list[str], config: dict[str, Any], seconds: float) -> dict[str, Any]:
        return self.measure(texts, config["batch"], config["ort_spinning"], config["length_sorted"], seconds)


def best_configs(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The ceiling (best items/s on texts in arrival order, as a server receives them), the oracle (best
    items/s with all texts sorted by length first, which no server can do with texts it has not seen
    yet) and the batch-1 latency floor."""
    return {"throughput": max((r for r in rows if not r["length_sorted"]), key=lambda r: r["items_per_s"]),
            "oracle": max(rows, key=lambda r: r["items_per_s"]),
            "latency": min((r for r in rows if r["batch"] == 1), key=lambda r: r["batch_p50_ms"])}


# -- 2./3. servers under load --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(command: list[str], port: int, log: Path, env: dict[str, str] | None = None, timeout: float = 300):
    """A server subprocess, yielded once GET /readyz answers 200; stopped with SIGTERM after."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
        try:
            deadline = time.monotonic() + timeout
            while asyncio.run(_status("127.0.0.1", port, "/readyz")) != 200:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{command[:4]} did not become ready; see {log}")
                time.sleep(0.5)
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


async def _status(host: str, port: int, path: str) -> int | None:
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return None
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    line = await reader.readline()
    writer.close()
    return int(line.split()[1]) if line else None


def encode_request(host: str, path: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    return head + payload


async def _client(host: str, port: int, requests: list[bytes], offset: int, stop_at: float, budget: list[int],
                  latencies: list[float], errors: dict[str, int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    k = offset
    try:
        while time.perf_counter() < stop_at and budget[0] > 0:
            budget[0] -= 1
            request = requests[k % len(requests)]
            k += 1
            start = time.perf_counter()
            writer.write(request)
            status_line = await reader.readline()
            length, close = 0, False
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                if name.lower() == "content-length":
                    length = int(value)
                elif name.lower() == "connection" and "close" in value.lower():
                    close = True
            await reader.readexactly(length)
            status = int(status_line.split()[1]) if status_line else 0
            if status == 200:
                latencies.append(time.perf_counter() - start)
            else:
                errors[str(status)] = errors.get(str(status), 0) + 1
            if close or not status_line:
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
    except (OSError, asyncio.IncompleteReadError) as error:
        errors[type(error).__name__] = errors.get(type(error).__name__, 0) + 1
    finally:
        writer.close()


async def load_level(port: int, requests: list[bytes], clients: int, seconds: float, max_requests: int,
                     warmup_s: float = 1.0) -> dict[str, Any]:
    """`clients` closed-loop clients for `seconds` (or `max_requests` in all), after an unmeasured warm-up."""
    await asyncio.gather(*(_client("127.0.0.1", port, requests, i, time.perf_counter() + warmup_s, [10**9], [], {})
                           for i in range(clients)))
    latencies: list[float] = []
    errors: dict[str, int] = {}
    budget = [max_requests]
    begin = time.perf_counter()
    await asyncio.gather(*(_client("127.0.0.1", port, requests, i * 7, begin + seconds, budget, latencies, errors)
                           for i in range(clients)))
    elapsed = time.perf_counter() - begin
    ms = np.array(latencies) * 1000 if latencies else np.array([float("nan")])
    return {"clients": clients, "requests": len(latencies), "seconds": elapsed,
            "requests_per_s": len(latencies) / elapsed, "items_per_s": len(latencies) / elapsed,
            "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "p99_ms": float(np.percentile(ms, 99)), "errors": errors}


def sweep(port: int, texts: dict[str, list[str]], concurrency: list[int], seconds: float, max_requests: int,
          label: str, rounds: int = 1, engine: Engine | None = None, best: dict[str, dict] | None = None
          ) -> list[dict]:
    """Each (texts, clients) level `rounds` times. With `engine`, the 1- and 32-client levels are each
    preceded by the engine's figure they are compared with (batch 1 latency, best-batch items/s), measured
    right then, so that a neighbour's burst of load hits both sides of the ratio alike."""
    rows = []
    for kind, items in texts.items():
        requests = [encode_request("127.0.0.1", "/v1/classify", {"inputs": t}) for t in items]
        for clients in concurrency:
            for round_index in range(rounds):
                adjacent = None
                if engine is not None and best is not None and clients in (1, 32):
                    config = best[kind]["latency" if clients == 1 else "throughput"]
                    adjacent = engine.again(items, config, seconds / 2)
                row = asyncio.run(load_level(port, requests, clients, seconds, max_requests))
                row.update(system=label, texts=kind, round=round_index, engine_adjacent=adjacent)
                rows.append(row)
                extra = ""
                if adjacent and clients == 1:
                    extra = f"  (engine batch-1 p50 {adjacent['batch_p50_ms']:.1f} ms)"
                elif adjacent:
                    extra = (f"  (engine batch {adjacent['batch']}: {adjacent['items_per_s']:.1f} items/s -> "
                             f"{row['items_per_s'] / adjacent['items_per_s']:.0%})")
                print(f"  {label:6s} {kind:5s} c={clients:<4d} {row['requests_per_s']:7.1f} req/s  "
                      f"p50 {row['p50_ms']:7.1f}  p99 {row['p99_ms']:7.1f} ms  errors {row['errors'] or 0}{extra}",
                      flush=True)
    return rows


# -- report -------------------------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def levels(rows: list[dict]) -> list[dict]:
    """The median over rounds of each (system, texts, clients) level."""
    grouped: dict[tuple, list[dict]] = {}
    for row in rows:
        grouped.setdefault((row["system"], row["texts"], row["clients"]), []).append(row)
    out = []
    for (system, kind, clients), group in grouped.items():
        merged = {"system": system, "texts": kind, "clients": clients, "rounds": len(group),
                  "errors": {k: sum(r["errors"].get(k, 0) for r in group) for r in group for k in r["errors"]}}
        for key in ("requests_per_s", "items_per_s", "p50_ms", "p95_ms", "p99_ms"):
            merged[key] = _median([r[key] for r in group])
        if group[0].get("engine_adjacent"):
            if clients == 1:
                merged["engine_batch1_p50_ms"] = _median([r["engine_adjacent"]["batch_p50_ms"] for r in group])
                merged["p50_minus_engine_batch1_ms"] = _median(
                    [r["p50_ms"] - r["engine_adjacent"]["batch_p50_ms"] for r in group])
            else:
                merged["engine_best_items_per_s"] = _median([r["engine_adjacent"]["items_per_s"] for r in group])
                merged["vs_engine_best"] = _median([r["items_per_s"] / r["engine_adjacent"]["items_per_s"]
                                                    for r in group])
        out.append(merged)
    return out


def summarize(best: dict[str, dict], service: list[dict], naive: list[dict]) -> dict[str, Any]:
    def level(rows, kind, clients):
        return next((r for r in rows if r["texts"] == kind and r["clients"] == clients), {})

    summary: dict[str, Any] = {}
    for kind, configs in best.items():
        s32, s1, n32, n1 = level(service, kind, 32), level(service, kind, 1), level(naive, kind, 32), level(naive, kind, 1)
        summary[kind] = {
            "engine_ceiling_config": {k: configs["throughput"][k] for k in ("batch", "ort_spinning", "length_sorted")},
            "engine_ceiling_items_per_s_sweep": configs["throughput"]["items_per_s"],
            "engine_ceiling_items_per_s_adjacent": s32.get("engine_best_items_per_s"),
            "engine_length_sorted_oracle_items_per_s_sweep": configs["oracle"]["items_per_s"],
            "service_32_vs_oracle_sweep": (s32["items_per_s"] / configs["oracle"]["items_per_s"]) if s32 else None,
            "service_32_items_per_s": s32.get("items_per_s"),
            "service_32_vs_engine": s32.get("vs_engine_best"),
            "naive_32_items_per_s": n32.get("items_per_s"),
            "service_32_vs_naive_32": (s32["items_per_s"] / n32["items_per_s"]) if s32 and n32 else None,
            "engine_batch1_p50_ms": s1.get("engine_batch1_p50_ms"),
            "service_1_client_p50_ms": s1.get("p50_ms"),
            "service_1_client_p50_minus_engine_ms": s1.get("p50_minus_engine_batch1_ms"),
            "naive_1_client_p50_ms": n1.get("p50_ms"),
        }
    return summary


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_report(result: dict) -> None:
    print("\nengine (ONNX Runtime alone, in process; sweep before the servers):")
    print(f"  {'texts':6s} {'batch':>5s} {'spinning':>8s} {'sorted':>6s} {'items/s':>9s} {'batch p50 ms':>13s}")
    for kind, rows in result["engine"].items():
        for row in rows:
            print(f"  {kind:6s} {row['batch']:>5} {str(row['ort_spinning']):>8s} {str(row['length_sorted']):>6s} "
                  f"{row['items_per_s']:9.1f} {row['batch_p50_ms']:13.2f}")
    print("\nservers (one text per request, closed loop; median of rounds):")
    print(f"  {'system':6s} {'texts':6s} {'clients':>7s} {'req/s':>8s} {'items/s':>8s} {'p50 ms':>8s} {'p95 ms':>8s} "
          f"{'p99 ms':>8s} {'vs engine':>9s}  errors")
    for row in result["levels"]:
        versus = _fmt(row.get("vs_engine_best"), ".0%")
        print(f"  {row['system']:6s} {row['texts']:6s} {row['clients']:>7d} {row['requests_per_s']:8.1f} "
              f"{row['items_per_s']:8.1f} {row['p50_ms']:8.1f} {row['p95_ms']:8.1f} {row['p99_ms']:8.1f} "
              f"{versus:>9s}  {row['errors'] or '-'}")
    print("\nsummary:")
    for kind, s in result["summary"].items():
        print(f"  {kind}: at 32 clients berth serves {_fmt(s['service_32_items_per_s'], '.1f')} items/s = "
              f"{_fmt(s['service_32_vs_engine'], '.0%')} of the engine ceiling {s['engine_ceiling_config']} "
              f"({_fmt(s['engine_ceiling_items_per_s_adjacent'], '.1f')} items/s measured alongside), "
              f"{_fmt(s['service_32_vs_naive_32'], '.1f')}x the naive peer "
              f"({_fmt(s['naive_32_items_per_s'], '.1f')}); 1 client p50 {_fmt(s['service_1_client_p50_ms'], '.1f')} ms "
              f"= engine batch-1 p50 + {_fmt(s['service_1_client_p50_minus_engine_ms'], '.1f')} ms "
              f"(naive {_fmt(s['naive_1_client_p50_ms'], '.1f')} ms)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="berth serve under load, next to the raw engine and a naive peer.")
    parser.add_argument("--checkpoint", type=Path, help="fine-tuned classification folder (default: build one)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "int8"])
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "bench-service", help="scratch folder")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per level")
    parser.add_argument("--max-requests", type=int, default=5000, help="most requests per level")
    parser.add_argument("--rounds", type=int, default=2, help="repeats of each berth level (medians reported)")
    parser.add_argument("--threads", type=int, default=2, help="inference threads (ORT and torch)")
    parser.add_argument("--kinds", nargs="+", default=["short", "long"], choices=["short", "long"])
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra `berth serve` flag (repeatable)")
    parser.add_argument("--quick", action="store_true", help="2 s levels, 1 and 32 clients, one round")
    parser.add_argument("--out", type=Path, default=RESULTS / "service_load.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.concurrency, args.batch_sizes, args.rounds = 2.0, [1, 32], [1, 32], 1

    args.work.mkdir(parents=True, exist_ok=True)
    checkpoint, repository = prepare_model(args.work, args.checkpoint, args.precision, max_seq_length=128)
    engine = Engine(repository, args.threads)
    texts = {k: v for k, v in load_texts(engine.tokenizer).items() if k in args.kinds}
    facts = machine_facts(args.threads, LIBRARIES)
    print(f"model {checkpoint} -> {repository / 'model'} ({args.precision}, {engine.provider}); load average "
          f"{facts['load_average']}; texts: " + ", ".join(f"{k} {token_stats(engine.tokenizer, v)}"
                                                         for k, v in texts.items()), flush=True)

    print("engine sweep ...", flush=True)
    engine_sweep = {kind: engine.sweep(items, args.batch_sizes, args.seconds / 4) for kind, items in texts.items()}
    best = {kind: best_configs(rows) for kind, rows in engine_sweep.items()}

    port = free_port()
    serve = [sys.executable, "-m", "berth.cli", "serve", "--models", str(repository), "--port", str(port),
             "--threads", str(args.threads), "--log-level", "warning", *args.serve_arg]
    print("berth serve sweep ...", flush=True)
    with running(serve, port, args.work / "serve.log"):
        service = sweep(port, texts, args.concurrency, args.seconds, args.max_requests, "berth", args.rounds,
                        engine, best)

    naive: list[dict] = []
    if not args.skip_naive:
        port = free_port()
        peer = [sys.executable, "-m", "bench.naive_peer", "--checkpoint", str(checkpoint), "--port", str(port),
                "--threads", str(args.threads)]
        print("naive peer sweep ...", flush=True)
        with running(peer, port, args.work / "naive.log"):
            naive = sweep(port, texts, args.concurrency, args.seconds, args.max_requests, "naive")

    service_levels, naive_levels = levels(service), levels(naive)
    result = {"machine": facts, "load_average_end": list(os.getloadavg()), "precision": args.precision,
              "checkpoint": str(checkpoint), "texts": {k: token_stats(engine.tokenizer, v) for k, v in texts.items()},
              "settings": {"seconds": args.seconds, "max_requests": args.max_requests, "rounds": args.rounds,
                           "serve_args": args.serve_arg, "threads": args.threads},
              "engine": engine_sweep, "levels": service_levels + naive_levels, "rounds": service + naive}
    result["summary"] = summarize(best, service_levels, naive_levels)
    print_report(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
