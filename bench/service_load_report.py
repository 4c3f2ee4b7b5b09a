"""The service load benchmark's report (bench/service_load.py): its result turned into the docs tables, per workload
and precision the figures beside their targets, the CPU budget, int8 against fp32, the rerank rows and berth against
Infinity. Pure functions of the recorded result, so `python -m bench.service_load --markdown JSON` redraws a table
from a record."""

from __future__ import annotations

from typing import Any

LONG_WORKLOADS = ("classify-long", "qa-long", "embed-long")
RERANK = "rerank"  # the rerank workload's name in the table (its own markdown table)


def summarize(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (workload, precision): the service's figures and their targets."""
    rows = []
    for name, per_precision in result["berth"].items():
        naive = result["naive"].get(name, {})
        for precision, levels in per_precision.items():
            engine = result["engine"][name][precision]
            by_clients = {row["clients"]: row for row in levels}
            top = 32 if 32 in by_clients else max(by_clients)  # rerank's levels stop lower (--rerank-concurrency)
            one, many = by_clients.get(1), (by_clients[top] if top != 1 else None)
            beside = naive.get(precision, {})
            peer32 = beside.get(top) or beside.get(str(top))  # (a JSON round trip makes the key a string)
            long = name in LONG_WORKLOADS
            row = {"workload": name, "precision": precision,
                   "engine_best_rps": engine["best_requests_per_s"], "engine_batch1_p50_ms": engine["batch1_p50_ms"],
                   "engine_one_pass_rps": engine.get("one_pass_best_requests_per_s", engine["best_requests_per_s"]),
                   "engine_parallel_rps": engine.get("parallel_best_requests_per_s"),
                   "engine_best_items_per_pass": engine["best_batch"] * engine.get("items_per_request", 1)}
            if many:
                row.update(clients_many=top, rps_32=many["requests_per_s"], p50_32=many.get("p50_ms"),
                           p99_32=many.get("p99_ms"),
                           share_of_engine=many["requests_per_s"] / engine["best_requests_per_s"],
                           share_target=0.85 if long else 0.90,
                           p99_over_p50=many["p99_ms"] / many["p50_ms"] if many.get("p99_ms") and many.get("p50_ms")
                           else None,
                           generator_cpu_share=many["generator_cpu_share"],
                           loop_cpu_ms_32=many.get("event_loop_cpu_ms_per_request"),
                           server_cpu_ms_32=many.get("server_cpu_ms_per_request"),
                           server_cpu_share_32=many.get("server_cpu_share"),
                           engine_cpu_ms=engine.get("best_cpu_ms_per_request"),
                           steal_engine=engine.get("steal_share"), steal_32=many.get("steal_share"),
                           items_per_pass_32=many.get("mean_items_per_pass"))
            if one:
                row.update(p50_1=one.get("p50_ms"), overhead_ms=(one.get("p50_ms") or 0) - engine["batch1_p50_ms"],
                           loop_cpu_ms_1=one.get("event_loop_cpu_ms_per_request"))
            if many and peer32:
                row.update(naive_rps_32=peer32["requests_per_s"],
                           vs_naive=many["requests_per_s"] / max(peer32["requests_per_s"], 1e-9),
                           vs_naive_target=5.0 if precision == "fp32" else 7.0)
            rows.append(row)
    return rows


def infinity_summary(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per embedding workload Infinity ran: berth (each precision) and each Infinity engine, one and many clients."""
    rows = []
    for name, engines in result.get("infinity", {}).items():
        row: dict[str, Any] = {"workload": name}
        systems = {f"berth-{p}": levels for p, levels in result["berth"].get(name, {}).items()}
        systems |= {f"infinity-{engine}": levels for engine, levels in engines.items()}
        for system, levels in systems.items():
            by_clients = {level["clients"]: level for level in levels}
            top = max(by_clients)
            row[system] = {"p50_1": (by_clients.get(1) or {}).get("p50_ms"), "clients": top,
                           "rps_many": by_clients[top]["requests_per_s"], "p99_many": by_clients[top].get("p99_ms")}
        rows.append(row)
    return rows


def infinity_markdown(result: dict[str, Any]) -> list[str]:
    """berth against Infinity per /v1/embeddings workload: req/s at the most clients, one client's p50, ratios."""
    rows = infinity_summary(result)
    if not rows:
        return [f"\nInfinity: not run ({result['infinity_skipped']})."] if result.get("infinity_skipped") else []
    systems = [k for k in rows[0] if k != "workload"]
    berths = [k for k in systems if k.startswith("berth-")]
    peers = [k for k in systems if k.startswith("infinity-")]
    top = rows[0][systems[0]]["clients"]
    lines = ["", f"| workload | {' | '.join(f'{k} req/s @{top} (p50 @1 ms)' for k in systems)} | "
             + " | ".join(f"{b} / {i}" for b in berths for i in peers) + " |",
             "|---|" + "---|" * (len(systems) + len(berths) * len(peers))]
    for row in rows:
        cells = [f"{figure(row[k]['rps_many'])} ({figure(row[k]['p50_1'])})" if k in row else "–" for k in systems]
        ratios = [figure(row[b]["rps_many"] / row[i]["rps_many"], ".2f") + "×" if b in row and i in row else "–"
                  for b in berths for i in peers]
        lines.append(f"| {row['workload']} | " + " | ".join(cells + ratios) + " |")
    versions = result.get("infinity_version") or {}
    lines.append(f"\nInfinity: {', '.join(f'{k} {v}' for k, v in versions.items())}.")
    return lines


def rerank_markdown(summary: list[dict[str, Any]], result: dict[str, Any]) -> list[str]:
    """The rerank rows: requests (one query, its documents) and documents per second, berth, engine, naive peer."""
    rows = [row for row in summary if row["workload"] == RERANK]
    if not rows:
        return []
    documents = result["workloads"][RERANK]["model_inputs"]
    lines = ["", f"| rerank ({documents} documents a request) | engine best req/s (docs/s) | engine batch-1 ms | "
             "berth p50 @1 ms | berth req/s (docs/s) @N | share of engine | CrossEncoder req/s @N | × CrossEncoder |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        many = row.get("clients_many")
        lines.append(
            f"| {row['precision']} | {figure(row['engine_best_rps'], '.2f')} "
            f"({figure(row['engine_best_rps'] * documents)}) | "
            f"{figure(row['engine_batch1_p50_ms'])} | {figure(row.get('p50_1'))} | {figure(row.get('rps_32'), '.2f')} "
            f"({figure((row.get('rps_32') or 0) * documents)}) @{many} | "
            f"{figure(100 * row.get('share_of_engine', float('nan')), '.0f')}% | "
            f"{figure(row.get('naive_rps_32'), '.2f')} @{many} | {figure(row.get('vs_naive'), '.1f')}× |")
    return lines


def percent(share: float | None) -> float | None:
    return None if share is None else 100 * share


def figure(value: float | None, spec: str = ".1f") -> str:
    return "–" if value is None else format(value, spec)


def report_markdown(result: dict[str, Any]) -> str:
    """The docs table: per workload and precision, the figures beside their targets."""
    lines = ["| workload | precision | engine best req/s (one pass / passes in parallel) | berth req/s @32 | "
             "share (target) | p50 @1 ms (engine b1 + overhead) | p99/p50 @32 | naive req/s @32 | × naive (target) | "
             "hey CPU share | event loop CPU ms/request @1 / @32 | CPU stolen engine / @32 | "
             "items per pass @32 (engine's best) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["summary"]:
        lines.append(
            f"| {row['workload']} | {row['precision']} | {figure(row['engine_best_rps'])} "
            f"({figure(row.get('engine_one_pass_rps'))} / {figure(row.get('engine_parallel_rps'))}) | "
            f"{figure(row.get('rps_32'))}"
            f"{'' if row.get('clients_many', 32) == 32 else ' @' + str(row['clients_many'])} | "
            f"{figure(100 * row.get('share_of_engine', float('nan')), '.0f')}% "
            f"(≥{100 * row.get('share_target', 0):.0f}%) | "
            f"{figure(row.get('p50_1'))} ({figure(row['engine_batch1_p50_ms'])} + {figure(row.get('overhead_ms'))}) | "
            f"{figure(row.get('p99_over_p50'), '.2f')} | {figure(row.get('naive_rps_32'))} | "
            f"{figure(row.get('vs_naive'), '.1f')}× (≥{figure(row.get('vs_naive_target'), '.0f')}×) | "
            f"{figure(100 * row.get('generator_cpu_share', float('nan')), '.0f')}% | "
            f"{figure(row.get('loop_cpu_ms_1'), '.2f')} / {figure(row.get('loop_cpu_ms_32'), '.2f')} | "
            f"{figure(percent(row.get('steal_engine')), '.0f')}% / {figure(percent(row.get('steal_32')), '.0f')}% | "
            f"{figure(row.get('items_per_pass_32'))} ({figure(row.get('engine_best_items_per_pass'), '.0f')}) |")
    lines += cpu_budget_markdown(result["summary"])
    load = [result.get("load_average_start"), result.get("load_average_end")]
    lines.append(f"\nGenerator: {result.get('generator', 'hey')}; load average at start / end: {load[0]} / {load[1]}.")
    return "\n".join(lines + int8_markdown(result["summary"]) + rerank_markdown(result["summary"], result)
                     + infinity_markdown(result))


def cpu_budget_markdown(summary: list[dict[str, Any]]) -> list[str]:
    """Where berth's share of the engine goes at the most clients: the CPU a request costs in the engine's best run
    and in berth (its event loop, the rest: passes, worker threads), and the share of the cores berth got. The
    share of the engine is, to rounding, CPU got x engine ms / berth ms (both on the same cores)."""
    rows = [row for row in summary if row.get("server_cpu_ms_32") and row.get("engine_cpu_ms")]
    if not rows:
        return []
    lines = ["", "| workload | precision | engine CPU ms/request (best run) | berth CPU ms/request @N: all (event "
             "loop + rest) | berth's share of the cores @N | CPU got x engine ms / berth ms | share measured |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        berth, loop = row["server_cpu_ms_32"], row.get("loop_cpu_ms_32") or 0.0
        lines.append(f"| {row['workload']} | {row['precision']} | {row['engine_cpu_ms']:.2f} | {berth:.2f} "
                     f"({loop:.2f} + {berth - loop:.2f}) | {100 * row['server_cpu_share_32']:.0f}% | "
                     f"{100 * row['server_cpu_share_32'] * row['engine_cpu_ms'] / berth:.0f}% | "
                     f"{100 * row['share_of_engine']:.0f}% |")
    return lines


def int8_markdown(summary: list[dict[str, Any]]) -> list[str]:
    """int8 against fp32 per workload that has both (engine and service), or nothing."""
    by = {(row["workload"], row["precision"]): row for row in summary}
    pairs = [(by[(w, "fp32")], row) for (w, precision), row in by.items() if precision == "int8" and (w, "fp32") in by]
    if not pairs:
        return []
    lines = ["", "| workload | engine best req/s fp32 → int8 | × | engine batch-1 ms fp32 → int8 | "
             "berth req/s @32 fp32 → int8 | × |", "|---|---|---|---|---|---|"]
    for fp32, int8 in pairs:
        service = [fp32.get("rps_32"), int8.get("rps_32")]
        ratio = service[1] / service[0] if None not in service else None
        lines.append(f"| {int8['workload']} | {figure(fp32['engine_best_rps'])} → {figure(int8['engine_best_rps'])} | "
                     f"{int8['engine_best_rps'] / fp32['engine_best_rps']:.2f} | "
                     f"{figure(fp32['engine_batch1_p50_ms'])} → {figure(int8['engine_batch1_p50_ms'])} | "
                     f"{figure(service[0])} → {figure(service[1])} | {figure(ratio, '.2f')} |")
    return lines
