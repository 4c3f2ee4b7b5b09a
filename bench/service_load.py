"""Service load benchmark: berth under load from a compiled generator, beside the raw engine and the naive peer.

One run, side by side, per workload (classify short/long, pair, NER, QA short/long
contexts, embed short/long, fill-mask, multiple choice) and precision (fp32, int8 bundles of the same
fine-tuned models):
1. the **raw engine**: ONNX Runtime on the bundle's model.onnx in this process (no HTTP, no queue, the
   request's inputs pre-encoded): batch-1 latency (the latency floor) and the best requests/s over batch
   sizes (the ceiling), each batch holding copies of the workload's request (as the generator sends);
2. **berth serve** (a real server on 127.0.0.1) under `hey` (a Go HTTP load generator from Debian:
   `apt-get install hey`) at each concurrency level, one request = one input, closed loop;
3. the **naive peer** (bench/naive_peer.py: FastAPI + a transformers pipeline / sentence-transformers,
   one forward per request; rerank: sentence-transformers' `CrossEncoder.predict`) on the same fine-tuned
   checkpoints (by default those the bundles' manifests name), under the same levels;
4. on the OpenAI `/v1/embeddings` workloads (one short text, one ~120-token text, 8 short texts), **Infinity**
   (bench/infinity_peer.py, its own venv; skipped with the reason when missing) on the embedding bundle's source
   checkpoint, its `optimum` (ONNX Runtime) and `torch` engines in turn, under berth's levels.
The `rerank` workload is one SQuAD v1.1 dev question with 20 paragraphs cut to ~100 tokens (one window each in a
128-token model), posted to `/v1/rerank`; it runs at its own levels (--rerank-concurrency, --rerank-seconds) and
engine batches (--rerank-batch-sizes: requests of 20 sequences).
The generator's own CPU time is measured (its rusage) and reported as a share of the machine, beside the
server's. Every level is bounded in time (--seconds); only 127.0.0.1 is used.

The whole run, from the repository `make bundles` builds (each bundle re-exported as fp32 and int8 from
its checkpoint into --work, once):

    .venv/bin/python -m bench.service_load --from-repository models --seconds 12 --concurrency 1 8 32 128 \
        --naive-concurrency 1 32

or from repositories already exported: `--models fp32=models/fp32 int8=models/int8`. Writes
bench/results/service_load.json (with the machine facts) and the docs table beside it (service_load.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from bench.load_tools import hey, hey_version, machine_cpu, steal_share
from bench.local_processes import REPO, free_port, running, serve_repository
from bench.machine import machine_facts
from bench.records import read_record
from bench.service_load_report import RERANK, figure, report_markdown, summarize
from tasks.registry import definition

RESULTS = REPO / "bench" / "results"
SHARED_DATA = Path(os.environ.get("BERTH_SHARED_DATA", REPO.parent / "shared" / "data"))
LIBRARIES = ("onnxruntime", "fastapi", "uvicorn", "torch", "transformers", "tokenizers", "numpy")


# -- the workloads: one real request body each ---------------------------------------------------------------


def workloads(tokenizer) -> dict[str, dict[str, Any]]:
    """name -> {"task", "body"}: real dev inputs of each task, short and long (the task's route serves them).

    Optional keys: "route" (another route of the task than its own), "engine_inputs" (the task's inputs when
    the route's request has another shape), "infinity" (Infinity runs it too), "own_levels" (a request of many
    model inputs: measured at --rerank-concurrency / --rerank-seconds / --rerank-batch-sizes)."""
    from tasks import qa, readers

    sst2 = readers.read_sst2(SHARED_DATA / "sst2" / "dev.tsv")
    # The reference short input: an SST-2 dev sentence of ~24 tokens.
    short = next(e.text for e in sst2 if len(tokenizer.encode(e.text).ids) == 24)
    long_text = " ".join(e.text for e in sst2[:12])
    words = long_text.split()
    while len(tokenizer.encode(" ".join(words)).ids) > 120:
        words = words[:-2]
    mrpc = readers.read_mrpc(SHARED_DATA / "mrpc" / "dev.tsv")[0]
    conll = [" ".join(e.tokens) for e in readers.read_conll(SHARED_DATA / "conll2003" / "iob2" / "valid.txt")]
    sentence = next(t for t in conll if 20 <= len(tokenizer.encode(t).ids) <= 40)
    squad = qa.read_squad(SHARED_DATA / "squad" / "v1.1" / "dev-v1.1.json")
    typical = squad[0]
    longest = max(squad[:3000], key=lambda e: len(e.context))
    masked = short.split()
    masked[len(masked) // 2] = "[MASK]"
    return {
        "classify-short": {"task": "classification", "body": {"inputs": short}},
        "classify-long": {"task": "classification", "body": {"inputs": " ".join(words)}},
        "pair": {"task": "pair", "body": {"inputs": {"text": mrpc.text, "text_pair": mrpc.text_pair}}},
        "ner": {"task": "ner", "body": {"inputs": sentence}},
        "qa": {"task": "qa", "body": {"inputs": {"question": typical.question, "context": typical.context}}},
        "qa-long": {"task": "qa", "body": {"inputs": {"question": longest.question, "context": longest.context}}},
        "embed": {"task": "embedding", "body": {"inputs": short}},
        "embed-long": {"task": "embedding", "body": {"inputs": " ".join(words)}},
        "fill-mask": {"task": "fill-mask", "body": {"inputs": " ".join(masked)}},
        # SWAG-like: a context and four endings (one model input each)
        "choice": {"task": "multiple-choice", "body": {"inputs": {"context": sst2[1].text, "choices": [
            e.text for e in sst2[2:6]]}}},
        # OpenAI's /v1/embeddings (what Infinity serves too): one short text, one ~120-token text, 8 short texts
        **{name: {"task": "embedding", "route": "/v1/embeddings", "body": {"input": texts, "model": None},
                  "engine_inputs": texts if isinstance(texts, list) else [texts], "infinity": True}
           for name, texts in (("embeddings", short), ("embeddings-long", " ".join(words)),
                               ("embeddings-8", [e.text for e in sst2[20:28]]))},
        RERANK: rerank_workload(tokenizer, squad),
    }


def rerank_workload(tokenizer, squad: list, documents: int = 20, tokens: int = 100) -> dict[str, Any]:
    """A SQuAD v1.1 dev question and `documents` paragraphs of its article and the next ones (its own first), each
    cut at a word boundary to at most `tokens` tokens (paragraphs shorter than that are passed over)."""
    paragraphs = [c for c in dict.fromkeys(e.context for e in squad)
                  if len(tokenizer.encode(c, add_special_tokens=False).ids) >= tokens]
    cut = [_cut_to_tokens(tokenizer, text, tokens) for text in paragraphs[:documents]]
    return {"task": "rerank", "body": {"query": squad[0].question, "documents": cut},
            "engine_inputs": [{"query": squad[0].question, "documents": cut}], "own_levels": True}


def _cut_to_tokens(tokenizer, text: str, tokens: int) -> str:
    """`text` up to the end of its `tokens`-th token, less a word cut in two."""
    end = tokenizer.encode(text, add_special_tokens=False).offsets[tokens - 1][1]
    kept = text[:end]
    if end < len(text) and text[end].isalnum():
        kept = kept.rsplit(" ", 1)[0]
    return kept


def request_inputs(bundle, tokenizer, load: dict) -> list[Any]:
    """The model inputs (sequences / windows) berth makes of one request: its task's own `prepare` of each input
    (the body's `inputs`, or the workload's `engine_inputs` where its route has another request shape)."""
    from types import SimpleNamespace

    task = definition(bundle.task)
    if "engine_inputs" in load:
        options, raws = task.options(), load["engine_inputs"]
    else:
        body = load["body"]
        options = task.options.model_validate({k: v for k, v in body.items() if k != "inputs"})
        raws = [body["inputs"]]
    # an input object (a pair, a question with its context...) is read by attribute
    raws = [SimpleNamespace(**raw) if isinstance(raw, dict) else raw for raw in raws]
    return [item for raw in raws for item in task.prepare(tokenizer, bundle.spec(), raw, options).items]


# -- 1. the raw engine ---------------------------------------------------------------------------------------


def engine_figures(bundle, items: list[Any], threads: int, batch_sizes: list[int], seconds: float) -> dict[str, Any]:
    """Batch-1 p50 latency and best requests/s over `batch_sizes` (requests per batch), ORT alone: one pass at a
    time on `threads` threads, and `threads` passes at once on one thread each (two ways to fill the cores;
    the ceiling is the better one, so the service's share is measured against the stricter of the two)."""
    from tasks.runtime.batching import pad_batch
    from tasks.runtime.onnx_session import create_session

    session, provider = create_session(bundle.model_path, bundle.precision, threads, prefer_gpu=False)
    single = create_session(bundle.model_path, bundle.precision, 1, prefer_gpu=False)[0] if threads > 1 else None
    rows, parallel_rows = [], []
    for batch in batch_sizes:
        feeds = pad_batch(items * batch)
        session.run(None, feeds)
        latencies, begin, cpu = [], time.perf_counter(), time.process_time()
        while time.perf_counter() - begin < seconds or len(latencies) < 3:
            start = time.perf_counter()
            session.run(None, feeds)
            latencies.append(time.perf_counter() - start)
        p50 = float(np.median(latencies))
        rows.append({"batch_requests": batch, "p50_ms": 1000 * p50, "requests_per_s": batch / p50,
                     "cpu_ms_per_request": 1000 * (time.process_time() - cpu) / (batch * len(latencies))})
        if single is not None:
            cpu = time.process_time()
            passes = side_by_side(functools.partial(single.run, None, feeds), threads, seconds)
            parallel_rows.append({"batch_requests": batch, "requests_per_s": batch * passes[0] / passes[1],
                                  "cpu_ms_per_request": 1000 * (time.process_time() - cpu) / (batch * passes[0])})
    best = max(rows, key=lambda r: r["requests_per_s"])
    best_parallel = max(parallel_rows, key=lambda r: r["requests_per_s"], default=None)
    ceiling = max([best, best_parallel] if best_parallel else [best], key=lambda r: r["requests_per_s"])
    return {"provider": provider, "items_per_request": len(items), "tokens": [len(i) for i in items],
            "batch1_p50_ms": rows[0]["p50_ms"] if rows[0]["batch_requests"] == 1 else None,
            "one_pass_best_requests_per_s": best["requests_per_s"], "one_pass_best_batch": best["batch_requests"],
            "parallel_best_requests_per_s": best_parallel["requests_per_s"] if best_parallel else None,
            "parallel_best_batch": best_parallel["batch_requests"] if best_parallel else None,
            "best_requests_per_s": ceiling["requests_per_s"], "best_batch": ceiling["batch_requests"],
            "best_cpu_ms_per_request": ceiling["cpu_ms_per_request"], "rows": rows, "parallel_rows": parallel_rows}


def side_by_side(run: Callable[[], Any], workers: int, seconds: float) -> tuple[int, float]:
    """Calls of `run` (a forward pass), and the seconds they took, of `workers` threads calling it at once."""
    import threading

    run()
    passes = [0] * workers
    end = time.perf_counter() + seconds

    def loop(worker: int) -> None:
        while time.perf_counter() < end or passes[worker] < 2:
            run()
            passes[worker] += 1

    threads = [threading.Thread(target=loop, args=(w,)) for w in range(workers)]
    begin = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(passes), time.perf_counter() - begin


# -- 2./3. servers under hey ---------------------------------------------------------------------------------


def naive_peer(checkpoint: Path, task: str, threads: int, work: Path):
    port = free_port()
    command = [sys.executable, "-m", "bench.naive_peer", "--checkpoint", str(checkpoint), "--task", task,
               "--port", str(port), "--threads", str(threads)]
    return port, running(command, port, work / f"naive-{task}.log")


# -- one command: the repositories by precision and the peers' checkpoints, from one model repository ----------


def export_precisions(repository: Path, precisions: list[str], work: Path, threads: int) -> dict[str, Path]:
    """`work/<precision>/<name>`: each bundle of `repository` exported again in each precision from the
    fine-tuned checkpoint its manifest names (once; an existing bundle is kept; int8 with the source bundle's own
    recipe when it is int8). An int8 export that fails its gate leaves that task out of the int8 repository (the
    benchmark says so)."""
    from export.bundle_builder import export_bundle
    from export.parity import ParityError
    from export.settings import ExportSettings
    from tasks.bundle_checks import load_bundle
    from tasks.runtime.bundle import find_bundles

    out = {}
    for precision in precisions:
        target = work / precision
        for folder in find_bundles(repository):
            bundle = load_bundle(folder)
            checkpoint = source_checkpoint(bundle)
            if (target / folder.name / "bundle.json").is_file() or not (checkpoint / "config.json").is_file():
                continue
            # an int8 bundle is exported again with its own recipe (build-defaults may have chosen a later one)
            recipe = (bundle.optimization.get("int8") or {}).get("recipe") if precision == "int8" else None
            print(f"exporting {folder.name} ({bundle.task}) as {precision} from {checkpoint}", flush=True)
            try:
                export_bundle(ExportSettings(model_folder=checkpoint, out=target / folder.name, precision=precision,
                                             task=bundle.task, threads=threads, device="cpu", int8_recipe=recipe))
            except ParityError as error:
                print(f"{folder.name}: {precision} failed its gate, left out:\n{error}", flush=True)
        out[precision] = target
    return out


def source_checkpoint(bundle: Any) -> Path:
    """The folder a bundle was exported from: its manifest names it relative to where export ran (the repository
    for build-defaults), or `default` for the embedded base; older bundles hold an absolute path."""
    named = bundle.source.get("checkpoint") or ""
    if named == "default":
        from training.bert.checkpoint import default_base_path

        return default_base_path()
    return Path(named) if Path(named).is_absolute() else REPO / named


def peer_checkpoints(repository: Path) -> dict[str, Path]:
    """task -> the fine-tuned checkpoint of the repository's bundle of that task (for the naive peer)."""
    from tasks.bundle_checks import load_bundle
    from tasks.runtime.bundle import find_bundles

    found = {}
    for folder in find_bundles(repository):
        bundle = load_bundle(folder)
        checkpoint = source_checkpoint(bundle)
        if bundle.task not in found and (checkpoint / "config.json").is_file():
            found[bundle.task] = checkpoint
    return found


def main(argv: list[str] | None = None) -> int:
    from tasks.bundle_checks import load_bundle
    from tasks.runtime.tokenizer import load_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", type=Path, metavar="JSON", help="print the docs table of a result file and exit")
    parser.add_argument("--models", nargs="+", metavar="PRECISION=FOLDER",
                        help="model repositories by precision; each holds one bundle per task "
                             "(classify, pair, ner, qa)")
    parser.add_argument("--checkpoints", nargs="+", default=[], metavar="TASK=FOLDER",
                        help="fine-tuned folders for the naive peer, by task (default: the checkpoints the bundles' "
                             "manifests name)")
    parser.add_argument("--from-repository", type=Path, metavar="FOLDER",
                        help="instead of --models: export each bundle of this repository (e.g. models/, as `make "
                             "bundles` builds it) in each of --precisions from its checkpoint, into --work")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "int8"])
    parser.add_argument("--workloads", nargs="+", help="a subset of the workloads")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--naive-concurrency", type=int, nargs="+", default=[32])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per load level")
    parser.add_argument("--engine-seconds", type=float, default=1.5, help="seconds per engine batch size")
    parser.add_argument("--threads", type=int, default=2, help="inference threads (ORT and torch)")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra `berth serve` flag (repeatable)")
    parser.add_argument("--rerank-concurrency", type=int, nargs="+", default=[1, 8],
                        help="load levels of the rerank workload (20 documents a request; the naive peer: the last)")
    parser.add_argument("--rerank-seconds", type=float, default=20.0, help="seconds per rerank load level")
    parser.add_argument("--rerank-batch-sizes", type=int, nargs="+", default=[1, 2],
                        help="requests per engine batch for rerank (20 sequences each)")
    parser.add_argument("--infinity-venv", type=Path, default=Path("/tmp/infinity-venv"),
                        help="the venv infinity-emb is installed in (bench/infinity_peer.py); missing: skipped")
    parser.add_argument("--infinity-engines", nargs="*", default=["optimum", "torch"],
                        help="Infinity's engines to run beside berth on the /v1/embeddings workloads (none: skip)")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "bench-service")
    parser.add_argument("--out", type=Path, default=RESULTS / "service_load.json")
    args = parser.parse_args(argv)
    if args.markdown:
        recorded = read_record(args.markdown)
        print(report_markdown({**recorded, "summary": summarize(recorded)}))
        return 0
    if not args.models and not args.from_repository:
        parser.error("--models or --from-repository is needed")
    if shutil.which("hey") is None:
        raise SystemExit("bench.service_load needs `hey` (a Go load generator): apt-get install -y hey")
    args.work.mkdir(parents=True, exist_ok=True)
    if args.from_repository:
        repositories = export_precisions(args.from_repository, args.precisions, args.work, args.threads)
    else:
        repositories = {k: Path(v) for k, v in (item.split("=", 1) for item in args.models)}
    checkpoints = peer_checkpoints(next(iter(repositories.values())))
    checkpoints.update({k: Path(v) for k, v in (item.split("=", 1) for item in args.checkpoints)})

    first = next(load_bundle(f) for f in sorted(next(iter(repositories.values())).iterdir())
                 if (f / "bundle.json").is_file())
    chosen = workloads(load_tokenizer(first.tokenizer_path))
    if args.workloads:
        chosen = {k: v for k, v in chosen.items() if k in args.workloads}
    result: dict[str, Any] = {"machine": machine_facts(args.threads, LIBRARIES), "generator": hey_version(),
                              "settings": vars(args) | {"models": {k: str(v) for k, v in repositories.items()}},
                              "load_average_start": list(os.getloadavg()), "workloads": {},
                              "engine": {}, "berth": {}, "naive": {}, "infinity": {}, "complete": False}
    result["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in result["settings"].items()}
    for precision, repository in repositories.items():
        # Read when its turn comes: a bundle still being exported at the start is measured if ready by then.
        by_task = {load_bundle(folder).task: load_bundle(folder) for folder in sorted(repository.iterdir())
                   if (folder / "bundle.json").is_file()}
        # Side by side: per route, the raw engine, berth (one server per precision, idle between levels) and
        # the naive peer of that route are measured back to back, so they see the same neighbours.
        port, server = serve_repository(repositories[precision], args.threads, args.work, args.serve_arg)
        with server as proc:
            for task in dict.fromkeys(load["task"] for load in chosen.values()):
                if task not in by_task:
                    print(f"no {precision} bundle for {task} (its export failed the gate?): skipped", flush=True)
                    continue
                bundle = by_task[task]
                peer = None
                if task in checkpoints and args.naive_concurrency:
                    peer_port, peer = naive_peer(checkpoints[task], task, args.threads, args.work)
                with peer if peer is not None else _nothing() as peer_proc:
                    for name, load in chosen.items():
                        if load["task"] != task:
                            continue
                        measure_workload(result, args, name, load, precision, bundle, port, proc)
                        if peer_proc is not None:
                            own = load.get("own_levels", False)
                            for clients in [max(args.rerank_concurrency)] if own else args.naive_concurrency:
                                row = hey(peer_port, load.get("route") or definition(task).route, load["body"],
                                          clients, args.rerank_seconds if own else args.seconds, peer_proc.pid,
                                          args.work)
                                result["naive"].setdefault(name, {}).setdefault(precision, {})[clients] = row
                                _print_level("naive", f"(beside {precision})", name, row)
                                _save(result, args.out)
                # Infinity beside berth's first precision, on the same embedding bundle's checkpoint
                infinity_loads = {n: v for n, v in chosen.items() if v.get("infinity") and v["task"] == task}
                if infinity_loads and precision == next(iter(repositories)):
                    measure_infinity(result, args, infinity_loads, bundle)
    result["complete"] = True
    _save(result, args.out)
    table = report_markdown(result)
    print("\n" + table)
    args.out.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
    print(f"\nwrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


def measure_workload(result: dict[str, Any], args: argparse.Namespace, name: str, load: dict[str, Any],
                     precision: str, bundle: Any, port: int, proc: subprocess.Popen) -> None:
    """The raw engine on the workload's request, then berth under hey at each level."""
    from tasks.runtime.tokenizer import load_tokenizer

    route = load.get("route") or definition(load["task"]).route
    if load["body"].get("model", "") is None:  # the bundle's name, which the Infinity peer is also served as
        load["body"]["model"] = bundle.name
    own = load.get("own_levels", False)  # its own levels (rerank: a request of many documents)
    items = request_inputs(bundle, load_tokenizer(bundle.tokenizer_path), load)
    result["workloads"][name] = {"route": route, "model_inputs": len(items), "tokens": [len(i) for i in items],
                                 "body": load["body"]}
    before = machine_cpu()
    figures = engine_figures(bundle, items, args.threads, args.rerank_batch_sizes if own else args.batch_sizes,
                             args.engine_seconds)
    figures["steal_share"] = steal_share(before, machine_cpu())
    result["engine"].setdefault(name, {})[precision] = figures
    print(f"engine {precision} {name}: batch-1 {figures['batch1_p50_ms']:.2f} ms, best "
          f"{figures['best_requests_per_s']:.1f} req/s at {figures['best_batch']} requests/batch (one pass "
          f"{figures['one_pass_best_requests_per_s']:.1f}, passes in parallel "
          f"{figure(figures['parallel_best_requests_per_s'])})", flush=True)
    for clients in args.rerank_concurrency if own else args.concurrency:
        row = hey(port, route, load["body"], clients, args.rerank_seconds if own else args.seconds, proc.pid,
                  args.work)
        result["berth"].setdefault(name, {}).setdefault(precision, []).append(row)
        _print_level("berth", precision, name, row)
        _save(result, args.out)


def measure_infinity(result: dict[str, Any], args: argparse.Namespace, loads: dict[str, dict[str, Any]],
                     bundle: Any) -> None:
    """Infinity (bench/infinity_peer.py) on the embedding bundle's source checkpoint, each engine in turn, under
    the same levels as berth; skipped with the reason when its venv is missing or it does not start."""
    from bench import infinity_peer

    if not args.infinity_engines:
        return
    reason = infinity_peer.unavailable(args.infinity_venv)
    checkpoint = source_checkpoint(bundle)
    if reason is None and not (checkpoint / "config.json").is_file():
        reason = f"the embedding bundle names no checkpoint folder ({checkpoint})"
    if reason is not None:
        print(f"Infinity skipped: {reason}", flush=True)
        result["infinity_skipped"] = reason
        return
    result["infinity_version"] = infinity_peer.version(args.infinity_venv)
    for engine in args.infinity_engines:
        try:
            port, server = infinity_peer.server(args.infinity_venv, engine, checkpoint, bundle.name, args.threads,
                                                args.work, free_port())
            with server as proc:
                for name, load in loads.items():
                    for clients in args.concurrency:
                        row = hey(port, infinity_peer.ROUTE, load["body"], clients, args.seconds, proc.pid,
                                  args.work)
                        result["infinity"].setdefault(name, {}).setdefault(engine, []).append(row)
                        _print_level("infinity", engine, name, row)
                        _save(result, args.out)
        except (RuntimeError, subprocess.CalledProcessError) as error:
            print(f"Infinity {engine} skipped: {error}", flush=True)
            result.setdefault("infinity_failed", {})[engine] = str(error)


@contextmanager
def _nothing():
    yield None


def _save(result: dict[str, Any], out: Path) -> None:
    """Written after every level, so a run cut short still leaves its measured levels."""
    result["load_average_end"] = list(os.getloadavg())
    result["summary"] = summarize(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


def _print_level(system: str, precision: str, name: str, row: dict[str, Any]) -> None:
    print(f"{system} {precision} {name} c={row['clients']}: {figure(row['requests_per_s'])} req/s, p50 "
          f"{figure(row.get('p50_ms'))} p99 {figure(row.get('p99_ms'))} ms, status {row['status']}, hey CPU "
          f"{100 * row['generator_cpu_share']:.0f}%, server CPU {100 * row['server_cpu_share']:.0f}%, event loop "
          f"{figure(row.get('event_loop_cpu_ms_per_request'), '.2f')} ms/request, "
          f"stolen {100 * row['steal_share']:.0f}%, "
          f"{figure(row.get('mean_items_per_pass'))} items per pass", flush=True)


if __name__ == "__main__":
    sys.exit(main())
