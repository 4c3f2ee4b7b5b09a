"""Every bundle's answers to its routes' documented examples, through the three callers of the inference engine: the
service's routes (the app in process), `berth.load` and `berth predict`. Run it on two trees and compare the files to
show a change kept the answers (it imports whichever tree is on PYTHONPATH):

    PYTHONPATH=. python scripts/answers_snapshot.py MODEL_REPOSITORY --out answers.json
    python scripts/answers_snapshot.py --compare before.json after.json [--out record.json]

An answer that is an error is recorded as its status and message. Rerank's response id (a fresh uuid) is left out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LONG_REPEAT = 40  # a text repeated this often passes every test bundle's max_seq_length (windows, truncation)
READY_WITHIN_S = 600
OPENAI_BODY = {"input": ["A man is playing a guitar.", "Tim Cook visited Berlin."]}


def bodies(task: Any) -> dict[str, list[dict[str, Any]]]:
    """Per route of the task: its documented examples, plus (own route, text inputs) one long text."""
    out: dict[str, list[dict[str, Any]]] = {}
    for endpoint in task.endpoints:
        examples = [dict(example) for example in endpoint.examples]
        if endpoint.kind == "openai":
            examples.append(dict(OPENAI_BODY))
        if endpoint is task.endpoints[0] and examples and endpoint.kind == "inputs" and not task.input_fields:
            first = examples[0]["inputs"]
            text = first if isinstance(first, str) else first[0]
            examples.append({"inputs": [" ".join([text] * LONG_REPEAT), text]})
        out[endpoint.path] = examples
    return out


def without_ids(answer: Any) -> Any:
    if isinstance(answer, dict):
        return {key: value for key, value in answer.items() if key != "id"}
    return answer


def service_answers(repository: Path, names: list[str], routes: dict[str, dict[str, list]]) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import ServiceSettings

    settings = ServiceSettings(models=repository, device="cpu", intra_op_threads=2, max_inputs_per_request=64)
    out: dict[str, Any] = {}
    with TestClient(create_app(settings)) as client:
        deadline = time.monotonic() + READY_WITHIN_S
        while client.get("/readyz").status_code != 200:
            if time.monotonic() > deadline:
                raise SystemExit(f"the service was not ready within {READY_WITHIN_S} s")
            time.sleep(0.5)
        for name in names:
            for path, examples in routes[name].items():
                for i, body in enumerate(examples):
                    response = client.post(path, json={**body, "model": name})
                    out[f"{name} {path} #{i}"] = [response.status_code, without_ids(response.json())]
    return out


def library_answers(repository: Path, names: list[str], routes: dict[str, dict[str, list]]) -> dict[str, Any]:
    import berth

    out: dict[str, Any] = {}
    for name in names:
        model = berth.load(repository / name, threads=2)
        for path, examples in routes[name].items():
            for i, body in enumerate(examples):
                try:
                    answer: Any = [200, without_ids(model.request(path, {**body, "model": name}))]
                except berth.RequestError as error:
                    answer = [error.status, error.message]
                out[f"{name} {path} #{i}"] = answer
    return out


def predict_rows(task: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The body's inputs as `berth predict` rows (a text column, or one column per input field)."""
    if task.endpoints[0].kind == "ranking":
        documents = [d["text"] if isinstance(d, dict) else d for d in body["documents"]]
        return [{"query": body["query"], "documents": documents}]
    inputs = body["inputs"] if isinstance(body["inputs"], list) else [body["inputs"]]
    return [raw if isinstance(raw, dict) else {"text": raw} for raw in inputs]


def predict_answers(repository: Path, names: list[str], tasks: dict[str, Any], routes: dict[str, dict[str, list]]
                    ) -> dict[str, Any]:
    """`berth predict` over each own-route example's inputs (the scalar options as flags)."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            task = tasks[name]
            for i, body in enumerate(routes[name][task.endpoints[0].path]):
                source, target = Path(folder) / f"{name}-{i}.jsonl", Path(folder) / f"{name}-{i}.out.jsonl"
                source.write_text("".join(json.dumps(row) + "\n" for row in predict_rows(task, body)))
                flags = [f"--{key.replace('_', '-')}={value}" for key, value in body.items()
                         if key in task.options.model_fields and isinstance(value, int | float | str)
                         and not isinstance(value, bool)]
                done = subprocess.run([sys.executable, "-m", "berth.cli", "predict", str(repository / name),
                                       str(source), "--out", str(target), "--threads", "2", "--no-progress", *flags],
                                      capture_output=True, text=True, env=os.environ)
                errors = target.with_name(target.name + ".errors.jsonl")
                out[f"{name} predict #{i}"] = {
                    "code": done.returncode,
                    "rows": [json.loads(line) for line in target.read_text().splitlines()] if target.exists() else [],
                    "errors": [json.loads(line) for line in errors.read_text().splitlines()] if errors.exists() else [],
                    "stderr": done.stderr.strip().splitlines()[-1:] if done.returncode else []}
    return out


def snapshot(repository: Path) -> dict[str, Any]:
    from tasks.registry import definition
    from tasks.runtime.bundle import find_bundles

    names = sorted(path.name for path in find_bundles(repository))
    tasks = {name: definition(json.loads((repository / name / "bundle.json").read_text())["task"]) for name in names}
    routes = {name: bodies(tasks[name]) for name in names}
    return {"service": service_answers(repository, names, routes),
            "berth.load": library_answers(repository, names, routes),
            "berth predict": predict_answers(repository, names, tasks, routes)}


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per caller: how many answers, and which differ."""
    counts = {}
    for caller in before:
        keys = sorted(set(before[caller]) | set(after.get(caller, {})))
        changed = [key for key in keys if before[caller].get(key) != after.get(caller, {}).get(key)]
        counts[caller] = {"answers": len(keys), "identical": len(keys) - len(changed), "differ": changed}
        print(f"{caller}: {len(keys) - len(changed)}/{len(keys)} answers identical" +
              (f"; differ: {changed}" if changed else ""))
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repository", nargs="?", type=Path, help="a folder of bundles")
    parser.add_argument("--out", type=Path, help="where to write the answers (with --compare: the record) as JSON")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(path.read_text()) for path in args.compare)
        counts = compare(before, after)
        if args.out:  # the record: the counts, the files' digests, the machine
            from bench.machine import machine_facts

            digests = {str(path): hashlib.sha256(path.read_bytes()).hexdigest() for path in args.compare}
            args.out.write_text(json.dumps({"command": " ".join(sys.argv), "compared": counts, "sha256": digests,
                                            "machine": machine_facts(2)}, indent=1) + "\n")
        return 1 if any(c["differ"] for c in counts.values()) else 0
    if args.repository is None or args.out is None:
        parser.error("give a repository and --out, or --compare BEFORE AFTER")
    answers = snapshot(args.repository)
    args.out.write_text(json.dumps(answers, indent=1, sort_keys=True))
    print(f"{args.out}: " + ", ".join(f"{caller} {len(got)}" for caller, got in answers.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
