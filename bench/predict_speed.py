"""`berth predict` rows/s beside its peers on one bundle and the same rows, in one run on one machine.

- **engine**: the rows prepared ahead by the task definition (not timed), sorted by length, cut into batches
  of one size padded to their longest item rounded up to 8 (as berth predict pads on the CPU), only
  `session.run` timed, on one session with every thread and on one-thread sessions side by side (one a
  thread, each running every lane-th batch: what berth predict runs by default); the best is the ceiling.
- **berth predict**: timed end to end (a subprocess: model load, reading, tokenizing, passes, decoding,
  writing Parquet, the final file).
- **HTTP service**: a real `berth serve` on 127.0.0.1 (the same bundle and threads), an asyncio httpx client
  with `--clients` concurrent requests, each posting `--rows-per-request` rows to the task's route.
- **Ray**: `berth predict --ray` on a Ray cluster of `--ray-nodes` nodes started here on 127.0.0.1 (one
  actor a node, each with `--threads / nodes` threads and as many CPUs), cluster start not timed.
- **RSS**: with `--rss-rows N`, berth predict over N rows (SST-2 lines repeated into a temporary file), its
  resident memory sampled every second; peak and trend (written as it goes, so a cut run keeps its samples).

    .venv/bin/python -m bench.predict_speed --bundle REPO/sentiment --out bench/results/predict_speed-sst2.json
    .venv/bin/python -m bench.predict_speed --bundle REPO/entities --data conll --rows 20000 --out ...json
    .venv/bin/python -m bench.predict_speed --bundle REPO/sentiment --only rss --rss-rows 1000000 --out ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import machine_facts

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
DATA = REPO.parent / "shared" / "data"
PARTS = ("predict", "engine", "http", "ray", "rss")


def load_texts(data: str, rows: int) -> list[str]:
    """SST-2's train sentences, its dev sentences (cycled to `rows`), or CoNLL-2003 sentences (train then valid,
    cycled to `rows`)."""
    if data == "conll":
        from tasks.readers import read_conll

        texts = [
            " ".join(e.tokens)
            for split in ("train", "valid")
            for e in read_conll(DATA / "conll2003" / "iob2" / f"{split}.txt")
        ]
        rows = rows or len(texts)
        return [texts[i % len(texts)] for i in range(rows)]
    with open(DATA / "sst2" / ("dev.tsv" if data == "sst2-dev" else "train.tsv"), encoding="utf-8") as f:
        texts = [line.split("\t")[0] for line in f.read().splitlines()[1:]]
    if data == "sst2-dev":
        return [texts[i % len(texts)] for i in range(rows or len(texts))]
    return texts[:rows] if rows else texts


def write_tsv(path: Path, texts: list[str], repeat_to: int = 0) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        f.write("text\n")
        total = repeat_to or len(texts)
        for i in range(total):
            f.write(texts[i % len(texts)].replace("\t", " ") + "\n")
    return path


def predict_command(bundle: Path, source: Path, out: Path, threads: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "berth.cli",
        "predict",
        str(bundle),
        str(source),
        "--out",
        str(out),
        "--threads",
        str(threads),
        "--no-progress",
        "--restart",
        *extra,
    ]


def run_predict(command: list[str]) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"berth predict failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started, json.loads(done.stdout.strip().splitlines()[-1])


def engine_ceiling(bundle: Path, texts: list[str], threads: int, batch_sizes: list[int]) -> dict[str, float]:
    """Rows/s of session.run alone per batch size, over the prepared items sorted by length: one session on
    every thread ("N"), and as many one-thread sessions as threads, each running every lane-th batch, side by
    side ("N x1", what berth predict and the service under load run)."""
    from concurrent.futures import ThreadPoolExecutor

    from tasks.engine import Engine
    from tasks.runtime.batching import pad_batch

    models = {lanes: Engine.load(bundle, threads=threads, lanes=lanes) for lanes in sorted({1, threads})}
    first = models[1]
    d = first.definition
    prepared = d.prepare_many(first.tokenizer, first.spec, texts, d.options())
    items = sorted((item for p in prepared for item in p.items), key=len)
    names = list(d.output_names)[:1]
    feeds_of = {}  # batch size -> its padded feeds, built once for every way of running them
    for size in batch_sizes:
        feeds_of[size] = []
        for at in range(0, len(items), size):
            batch = items[at : at + size]
            padded = pad_batch(batch, pad_to=-(-max(len(x) for x in batch) // 8) * 8)
            feeds_of[size].append({node.name: padded[node.name] for node in first.sessions[0].get_inputs()})
    rates = {}
    for lanes, model in models.items():
        label = f"{threads}" if lanes == 1 else f"{lanes}x1"
        for size, feeds in feeds_of.items():
            for session in model.sessions:
                session.run(names, feeds[len(feeds) // 2])  # warm

            def lane(k: int, feeds: list = feeds, sessions: list = model.sessions) -> None:
                for feed in feeds[k :: len(sessions)]:
                    sessions[k].run(names, feed)

            started = time.perf_counter()
            with ThreadPoolExecutor(len(model.sessions)) as pool:
                list(pool.map(lane, range(len(model.sessions))))
            rates[f"{label} threads, batch {size}"] = len(texts) / (time.perf_counter() - started)
    return rates


async def post_all(
    url: str, path: str, model: str, texts: list[str], clients: int, per_request: int
) -> float:
    """Seconds to send every text: `clients` workers, each posting its next `per_request` texts in turn."""
    import httpx

    chunks = [texts[at : at + per_request] for at in range(0, len(texts), per_request)]
    queue = iter(chunks)

    async def client(http: httpx.AsyncClient) -> None:
        for chunk in queue:
            response = await http.post(path, json={"model": model, "inputs": chunk})
            response.raise_for_status()

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        await http.post(path, json={"model": model, "inputs": texts[:per_request]})  # warm
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return time.perf_counter() - started


def http_rate(bundle: Path, texts: list[str], threads: int, clients: int, per_request: int) -> dict:
    import httpx

    from bench.local_processes import free_port, stop_process, wait_for
    from tasks.registry import definition

    task = json.loads((bundle / "bundle.json").read_text())["task"]
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "serve.log"
        with open(log, "wb") as out:
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "berth.cli",
                    "serve",
                    "--models",
                    str(bundle.parent),
                    "--model",
                    bundle.name,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--threads",
                    str(threads),
                ],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(url + "/readyz", server, log, timeout=300)
            path = definition(task).route
            seconds = asyncio.run(post_all(url, path, bundle.name, texts, clients, per_request))
            metrics = httpx.get(url + "/metrics", timeout=10).text
        finally:
            stop_process(server)
    return {
        "rows_per_s": round(len(texts) / seconds, 1),
        "seconds": round(seconds, 2),
        "clients": clients,
        "rows_per_request": per_request,
        "route": path,
        "metrics_bytes": len(metrics),
    }


def ray_rate(bundle: Path, source: Path, rows: int, threads: int, nodes: int, folder: Path) -> dict:
    from bench.local_processes import RayCluster

    per_node = max(1, threads // nodes)
    cluster = RayCluster(nodes=nodes, cpus_per_node=per_node)
    try:
        wall, summary = run_predict(
            predict_command(bundle, source, folder / "ray.parquet", per_node, "--ray", cluster.address)
        )
    finally:
        cluster.stop()
    return {
        "rows_per_s": round(rows / wall, 1),
        "wall_s": round(wall, 2),
        "nodes": nodes,
        "threads_per_actor": per_node,
        "summary": summary,
    }


def rss_run(bundle: Path, texts: list[str], rows: int, threads: int, record: dict, out: Path) -> dict:
    """berth predict over `rows` rows, its VmRSS every second; written into `record` at `out` as it goes."""
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        source = write_tsv(Path(folder) / "million.tsv", texts, repeat_to=rows)
        command = predict_command(bundle, source, Path(folder) / "out.parquet", threads)
        started = time.perf_counter()
        process = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        samples: list[tuple[float, float]] = []
        result = record.setdefault("rss", {"rows": rows, "samples_s_mib": samples})
        while process.poll() is None:
            try:
                status = Path(f"/proc/{process.pid}/status").read_text()
                rss = (
                    int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
                    / 1024
                )
                samples.append((round(time.perf_counter() - started, 1), round(rss, 1)))
            except (OSError, StopIteration):
                pass
            if len(samples) % 30 == 0:
                result.update(rss_trend(samples))
                write(out, record)
            time.sleep(1.0)
        stdout = process.communicate()[0]
        result.update(
            rss_trend(samples), wall_s=round(time.perf_counter() - started, 1), exit_code=process.returncode
        )
        if process.returncode == 0:
            result["summary"] = json.loads(stdout.strip().splitlines()[-1])
    return result


def rss_trend(samples: list[tuple[float, float]]) -> dict:
    """Peak, and the mean RSS of each quarter of the run after the first: flat means the quarters agree."""
    if len(samples) < 8:
        return {"peak_mib": max((s for _, s in samples), default=0.0)}
    body = samples[len(samples) // 4 :]
    quarter = max(1, len(body) // 3)
    means = [
        round(sum(s for _, s in part) / len(part), 1)
        for part in (body[:quarter], body[quarter : 2 * quarter], body[2 * quarter :])
    ]
    return {
        "peak_mib": max(s for _, s in samples),
        "mean_mib_by_third_after_warmup": means,
        "growth_mib_first_to_last_third": round(means[-1] - means[0], 1),
    }


def write(out: Path, record: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--data", choices=["sst2", "sst2-dev", "conll"], default="sst2")
    parser.add_argument("--rows", type=int, default=0,
                        help="the first N rows (0: all of SST-2's train set; sst2-dev and conll: cycled to N)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 32, 64]
    )
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rows-per-request", type=int, default=8)
    parser.add_argument("--ray-nodes", type=int, default=2)
    parser.add_argument("--rss-rows", type=int, default=1_000_000)
    parser.add_argument("--only", nargs="+", choices=PARTS, default=["predict", "engine", "http", "ray"])
    parser.add_argument("--out", type=Path, default=RESULTS / "predict_speed.json")
    args = parser.parse_args(argv)

    texts = load_texts(args.data, args.rows)
    record: dict = {
        "bundle": str(args.bundle),
        "data": args.data,
        "rows": len(texts),
        "threads": args.threads,
        "machine": machine_facts(args.threads),
    }
    table = []
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        source = write_tsv(folder / "input.tsv", texts)
        if "predict" in args.only:
            wall, summary = run_predict(
                predict_command(args.bundle, source, folder / "out.parquet", args.threads)
            )
            record["predict"] = {
                "rows_per_s": round(len(texts) / wall, 1),
                "wall_s": round(wall, 2),
                "summary": summary,
            }
            table.append(
                (f"berth predict (end to end, {len(texts):,} rows)", record["predict"]["rows_per_s"])
            )
        if "engine" in args.only:
            rates = engine_ceiling(args.bundle, texts, args.threads, args.batch_sizes)
            record["engine_rows_per_s"] = {k: round(v, 1) for k, v in rates.items()}
            record["engine_best"] = best = max(rates, key=rates.get)
            table += [(f"engine, session.run only, {k}", round(v, 1)) for k, v in rates.items()]
            if "predict" in record:
                record["ratio_predict_to_engine"] = round(record["predict"]["rows_per_s"] / rates[best], 3)
        if "http" in args.only:
            record["http"] = http_rate(args.bundle, texts, args.threads, args.clients, args.rows_per_request)
            table.append(
                (
                    f"berth serve, {args.clients} clients x {args.rows_per_request} rows a request",
                    record["http"]["rows_per_s"],
                )
            )
        if "ray" in args.only and args.ray_nodes:
            record["ray"] = ray_rate(args.bundle, source, len(texts), args.threads, args.ray_nodes, folder)
            table.append((f"berth predict --ray, {args.ray_nodes} local nodes", record["ray"]["rows_per_s"]))
        write(args.out, record)
    if "rss" in args.only:
        rss = rss_run(args.bundle, texts, args.rss_rows, args.threads, record, args.out)
        table.append((f"RSS over {args.rss_rows:,} rows: peak MiB", rss.get("peak_mib", 0.0)))
    write(args.out, record)
    print("| what | rows/s |\n|---|---:|")
    for what, value in table:
        print(f"| {what} | {value:,.0f} |")
    if "ratio_predict_to_engine" in record:
        print(
            f"\nberth predict / best engine run ({record['engine_best']}): "
            f"{record['ratio_predict_to_engine']:.2f}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
