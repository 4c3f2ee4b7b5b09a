"""One QA bundle served on the GPU: the raw engine's best batch beside `berth serve` under `hey`, same device.

    python -m bench.gpu_serving BUNDLE --dev DEV.json --out serving.json [--device cuda] [--concurrency 1 32]

The request is the first question of the dev file with its paragraph (as bench/service_load.py's `qa` workload);
one request = one item, so the server's requests/s are items/s. The raw engine runs the same prepared windows,
copied into batches of `--batch-sizes` requests (bench/batch_table.py's timing), on the provider `--device`
picks. The JSON is written after each step, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from bench.batch_table import time_pass
from bench.load_tools import hey
from bench.local_processes import serve_repository
from bench.service_load import request_inputs
from tasks import qa
from tasks.registry import definition


def engine_rows(bundle: Any, items: list[Any], batch_sizes: list[int], seconds: float, gpu: bool,
                threads: int) -> dict[str, Any]:
    """Median pass time and requests/s per batch size of `items` (one request's model inputs) on one session."""
    from tasks.runtime.batching import pad_batch
    from tasks.runtime.onnx_session import create_session

    session, provider = create_session(bundle.model_path, bundle.precision, threads, prefer_gpu=gpu)
    rows = []
    for batch in batch_sizes:
        seconds_per_pass = time_pass(session, pad_batch(items * batch), seconds)
        rows.append({"batch_requests": batch, "p50_ms": 1000 * seconds_per_pass,
                     "requests_per_s": batch / seconds_per_pass})
    best = max(rows, key=lambda row: row["requests_per_s"])
    return {"provider": provider, "items_per_request": len(items), "rows": rows,
            "best_requests_per_s": best["requests_per_s"], "best_batch": best["batch_requests"]}


def main(argv: list[str] | None = None) -> int:
    from tasks.bundle_checks import load_bundle
    from tasks.runtime.tokenizer import load_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path, help="a QA bundle folder")
    parser.add_argument("--dev", type=Path, required=True, help="SQuAD JSON: its first question is the request")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="engine and server")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per load level")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    parser.add_argument("--engine-seconds", type=float, default=1.0, help="timing per engine batch size")
    parser.add_argument("--threads", type=int, default=4, help="ORT intra-op threads (engine and server)")
    parser.add_argument("--work", type=Path, required=True, help="scratch folder (the served repository)")
    args = parser.parse_args(argv)

    args.work.mkdir(parents=True, exist_ok=True)
    bundle = load_bundle(args.bundle)
    first = qa.read_squad(args.dev)[0]
    body = {"inputs": {"question": first.question, "context": first.context}}
    items = request_inputs(bundle, load_tokenizer(bundle.tokenizer_path), {"task": "qa", "body": body})
    result: dict[str, Any] = {"device": args.device, "request": body, "settings": {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}

    def save() -> None:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    result["engine"] = engine_rows(bundle, items, args.batch_sizes, args.engine_seconds, args.device == "cuda",
                                   args.threads)
    save()
    repository = args.work / "repository"
    shutil.rmtree(repository, ignore_errors=True)
    shutil.copytree(args.bundle, repository / bundle.name)
    port, server = serve_repository(repository, args.threads, args.work, ["--device", args.device])
    result["berth"] = []
    with server as proc:
        for clients in args.concurrency:
            row = hey(port, definition("qa").route, body, clients, args.seconds, proc.pid, args.work)
            result["berth"].append(row)
            print(f"berth serve, {clients} clients: {row['requests_per_s']:.1f} items/s, p50 {row['p50_ms']} ms",
                  flush=True)
            save()
    result["berth_share_of_engine"] = {
        row["clients"]: row["requests_per_s"] / result["engine"]["best_requests_per_s"] for row in result["berth"]}
    save()
    print(json.dumps({"engine": result["engine"], "berth_share_of_engine": result["berth_share_of_engine"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
