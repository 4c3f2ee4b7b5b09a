"""The GPU check: berth's GPU paths run once, in one go, on a CUDA machine; one JSON record and a log.

    python -m bench.gpu_check --out DIR --pack gpu_pack [--dry-run]        (scripts/gpu_check.sh)

Phases, each a subprocess with its own time limit (clipped to what is left of --budget-s), each recorded in
DIR/gpu_check.json as ok / failed / timeout / skipped with its wall time, command, metrics and, when it did not
succeed, the tail of its output; a phase that fails does not stop the phases that do not need it:
1. setup: unpack the pack (bench/gpu_pack.py): SQuAD files, the wheels this Python lacks, `hey`;
2. environment: GPU, driver, torch / CUDA, ONNX Runtime providers (bench/gpu_environment.py);
3. finetune: `berth finetune --task qa` on the pack's SQuAD v1.1 train file, scored on the whole dev file;
4. export: `berth export --precision fp16` of the finetune model with its parity gate (on ONNX Runtime's CUDA
   provider where it has one, else on the CPU provider, as `--device auto` decides);
5. serve: where ONNX Runtime has CUDA, `berth serve` on that bundle under `hey` beside the raw engine's best
   batch on the same GPU (bench/gpu_serving.py);
6. ddp: the fine-tuning through `torchrun` (one process per GPU: 1 here; NCCL on CUDA), a short time budget; last,
   as the phase the budget can best lose. berth joins a process group only at a world size above 1
   (training/loop/distributed.py), so on one GPU this runs torchrun's launch and the one-process loop, and records that
   no backend was joined; the dry run starts 2 CPU processes (gloo) so that the group, its sharding and the
   record's backend field are exercised.
`--dry-run` runs every phase on this CPU on a tiny slice (fp32, a few steps; serve on the CPU provider), the
test suite's way of keeping the check from rotting. Only the standard library is imported here: the setup phase
is what makes the rest importable.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TAIL_CHARS = 8000
MIN_PHASE_S = 20  # a phase with less than this left of the budget is skipped, not started

# The paper's SQuAD v1.1 recipe (batch 32, lr 5e-5, 2-3 epochs, 384-token windows, stride 128) scaled to the L6/H384
# base: lr 1e-4 (the learning-rate sweep's pick for this base), 2 epochs, bf16 autocast; a training budget so the
# whole check stays under 8 minutes whatever the GPU's speed.
GPU_PLAN: dict[str, Any] = {
    "device": "cuda", "precision": "bf16", "batch_size": 32, "learning_rate": 1e-4, "epochs": 2,
    "max_seq_length": 384, "doc_stride": 128, "finetune_minutes": 3.0, "ddp_minutes": 0.75, "ddp_processes": 1,
    "max_train_examples": None, "max_eval_examples": None, "ddp_eval_examples": 500, "max_steps": None,
    "threads": None, "parity_examples": 100, "metric_examples": 1000, "serve_device": "cuda",
    "serve_seconds": 8.0, "serve_batch_sizes": [1, 8, 32, 64, 128],
    "limits_s": {"setup": 60, "environment": 60, "finetune": 300, "export": 150, "serve": 120, "ddp": 150},
    "budget_s": 460,
}
DRY_PLAN: dict[str, Any] = {
    **GPU_PLAN, "device": "cpu", "precision": "fp32", "batch_size": 8, "epochs": 1, "max_seq_length": 128,
    "doc_stride": 32, "finetune_minutes": 1.0, "ddp_minutes": 1.0, "ddp_processes": 2, "max_train_examples": 24,
    "max_eval_examples": 16,
    "ddp_eval_examples": 8, "max_steps": 3, "threads": 1, "parity_examples": 16, "metric_examples": 16,
    "serve_device": "cpu", "serve_seconds": 1.0, "serve_batch_sizes": [1, 4],
    "limits_s": {"setup": 60, "environment": 60, "finetune": 120, "export": 120, "serve": 90, "ddp": 120},
    "budget_s": 420,
}


class Check:
    """The record, the log, and the time budget the phases share."""

    def __init__(self, out: Path, plan: dict[str, Any], dry_run: bool) -> None:
        self.out, self.plan = out, plan
        self.log_path, self.json_path = out / "gpu_check.log", out / "gpu_check.json"
        self.deadline = time.monotonic() + plan["budget_s"]
        self.began = time.monotonic()
        self.record: dict[str, Any] = {
            "mode": "dry-run" if dry_run else "gpu", "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "git_revision": _git_revision(), "plan": plan, "phases": {}, "complete": False}
        self.log_path.write_text("", encoding="utf-8")

    def save(self) -> None:
        self.record["total_wall_s"] = round(time.monotonic() - self.began, 1)
        self.json_path.write_text(json.dumps(self.record, indent=2) + "\n", encoding="utf-8")

    def log(self, line: str) -> None:
        print(line, flush=True)
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(line + "\n")

    def skip(self, name: str, reason: str) -> None:
        self.log(f"== {name}: skipped: {reason}")
        self.record["phases"][name] = {"status": "skipped", "reason": reason}
        self.save()

    def run(self, name: str, command: list[str], env: dict[str, str] | None = None) -> dict[str, Any] | None:
        """Run one phase's command under its limit, its output appended to the log; its record, None if skipped."""
        limit = min(self.plan["limits_s"][name], self.deadline - time.monotonic())
        if limit < MIN_PHASE_S:
            self.skip(name, f"{max(limit, 0):.0f} s left of the {self.plan['budget_s']} s budget")
            return None
        phase: dict[str, Any] = {"status": "running", "limit_s": round(limit), "command": shlex.join(command)}
        self.record["phases"][name] = phase
        self.save()
        self.log(f"== {name} (limit {limit:.0f} s): {phase['command']}")
        start = self.log_path.stat().st_size
        begin = time.monotonic()
        with open(self.log_path, "ab") as log:
            # its own process group: torchrun's workers and the server die with it at the limit
            proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            try:
                phase["returncode"] = proc.wait(timeout=limit)
                phase["status"] = "ok" if proc.returncode == 0 else "failed"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                phase["status"] = "timeout"
        phase["wall_s"] = round(time.monotonic() - begin, 1)
        if phase["status"] != "ok":
            with open(self.log_path, "rb") as log:
                log.seek(start)
                phase["error_tail"] = log.read().decode("utf-8", "replace")[-TAIL_CHARS:]
        self.log(f"== {name}: {phase['status']} in {phase['wall_s']} s")
        self.save()
        return phase

    def measure(self, name: str, phase: dict[str, Any] | None, read) -> None:
        """Attach `read()`'s metrics to a phase; a reading that fails marks the phase failed, with the reason."""
        if phase is None or phase["status"] != "ok":
            return
        try:
            phase["metrics"] = read()
        except (OSError, KeyError, ValueError, TypeError) as error:
            phase["status"] = "failed"
            phase["error_tail"] = f"reading the results: {type(error).__name__}: {error}"
        self.save()


def _git_revision() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except OSError:
        return None


# -- 1. setup ------------------------------------------------------------------------------------------------


def unpack(pack: Path, work: Path, python: str) -> dict[str, Any]:
    """The pack's model and data into work/ (its .xz files decompressed), the wheels this Python lacks at their
    version into work/site (a wheel is a zip of its site-packages files), `hey` into work/bin. The setup phase
    runs it as `--unpack`."""
    for part in ("model", "data"):
        for path in (p for p in (pack / part).rglob("*") if p.is_file()):
            target = work / path.relative_to(pack)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == ".xz":
                with lzma.open(path) as source, open(target.with_suffix(""), "wb") as out:
                    shutil.copyfileobj(source, out, 1 << 22)
            else:
                shutil.copy2(path, target)
    wheels = [wheel for wheel in sorted((pack / "wheels").glob("*.whl")) if not _installed(wheel)]
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(work / "site")
    if (pack / "bin" / "hey").is_file():
        (work / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(pack / "bin" / "hey", work / "bin" / "hey")
        (work / "bin" / "hey").chmod(0o755)
    facts = {"python": python, "files": sorted(str(p.relative_to(work)) for p in work.rglob("*.json")),
             "wheels_installed": [wheel.name for wheel in wheels],
             "hey": shutil.which("hey", path=os.pathsep.join([str(work / "bin"), os.environ.get("PATH", "")]))}
    (work / "setup.json").write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    return facts


def _installed(wheel: Path) -> bool:
    """Whether this Python already has the wheel's distribution at the wheel's version (`name-version-...whl`)."""
    name, version = wheel.name.split("-")[:2]
    try:
        return metadata.version(name) == version
    except metadata.PackageNotFoundError:
        return False


# -- 3./4. finetune and ddp ----------------------------------------------------------------------------------


def finetune_command(plan: dict[str, Any], train: Path, dev: Path, base: Path, out: Path, minutes: float,
                     eval_examples: int | None) -> list[str]:
    flags = {"--task": "qa", "--train": train, "--dev": dev, "--out": out, "--base": base,
             "--epochs": plan["epochs"], "--max-steps": plan["max_steps"], "--max-minutes": minutes,
             "--batch-size": plan["batch_size"], "--lr": plan["learning_rate"], "--warmup-ratio": 0.1,
             "--max-seq-length": plan["max_seq_length"], "--doc-stride": plan["doc_stride"],
             "--precision": plan["precision"], "--device": plan["device"], "--threads": plan["threads"],
             "--max-train-examples": plan["max_train_examples"], "--max-eval-examples": eval_examples,
             "--resume": "never", "--seed": 42}
    return ["finetune", *(str(a) for k, v in flags.items() if v is not None for a in (k, v)), "--no-progress-bar"]


def finetune_metrics(folder: Path) -> dict[str, Any]:
    run = json.loads((folder / "finetune_run.json").read_text(encoding="utf-8"))
    result = run["train_result"]
    return {"exact": run["dev_metrics"]["exact"], "f1": run["dev_metrics"]["f1"],
            "dev_questions": run["dev_examples"], "train_questions": run["train_examples"],
            "train_file": run["settings"]["train_file"], "train_minutes": run["train_minutes"],
            "eval_minutes": run["eval_minutes"], "tokens_per_s": result["tokens_per_s"],
            "examples_per_s": result["examples_per_s"], "steps": result["steps"], "epochs": result["epochs"],
            "planned_steps": result["planned_steps"], "stopped_by": result["stopped_by"],
            "fitted_to_budget": result["fitted_to_budget"], "precision": result["precision"],
            "world_size": result["world_size"], "device": run["settings"]["device"],
            "padded_over_real_tokens": run["speed"]["padded_over_real_tokens"]}


def ddp_backend(log: str) -> str | None:
    found = re.findall(r"distributed: (\w+) backend", log)
    return found[-1] if found else None


# -- 5. export -----------------------------------------------------------------------------------------------


def export_metrics(bundle: Path, cuda_provider: bool | None) -> dict[str, Any]:
    manifest = json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))
    parity = manifest["parity"]
    return {"precision": manifest["precision"], "parity_provider": parity["provider"], "passed": parity["passed"],
            "onnxruntime_cuda_provider": cuda_provider, "agreement": parity["agreement"],
            "confident_agreement": parity["confident_agreement"], "max_abs_diff": parity["max_abs_diff"],
            "metric": {k: parity["metric"][k] for k in ("name", "reference", "candidate", "delta_points", "passed",
                                                        "examples")} if parity.get("metric") else None,
            "model_bytes": manifest.get("model_bytes") or (bundle / "model.onnx").stat().st_size}


# -- 6. serve ------------------------------------------------------------------------------------------------


def serving_metrics(path: Path) -> dict[str, Any]:
    result = json.loads(path.read_text(encoding="utf-8"))
    engine = result["engine"]
    return {"device": result["device"], "engine_provider": engine["provider"],
            "engine_best_items_per_s": engine["best_requests_per_s"], "engine_best_batch": engine["best_batch"],
            "berth_items_per_s": {row["clients"]: row["requests_per_s"] for row in result["berth"]},
            "berth_p50_ms": {row["clients"]: row["p50_ms"] for row in result["berth"]},
            "berth_p99_ms": {row["clients"]: row["p99_ms"] for row in result["berth"]},
            "berth_share_of_engine": result["berth_share_of_engine"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="gpu_check.json and gpu_check.log go here")
    parser.add_argument("--pack", type=Path, required=True, help="the folder bench/gpu_pack.py built")
    parser.add_argument("--work", type=Path, default=Path("/tmp/berth-gpu-check"),
                        help="scratch: unpacked data, models, bundles (not under --out: they are large)")
    parser.add_argument("--dry-run", action="store_true", help="a tiny slice on this CPU (the test suite's run)")
    parser.add_argument("--budget-s", type=float, help="the whole check's time (default: the plan's)")
    parser.add_argument("--unpack", action="store_true", help=argparse.SUPPRESS)  # the setup phase's own process
    args = parser.parse_args(argv)
    if args.unpack:
        print(json.dumps(unpack(args.pack.resolve(), args.work, sys.executable), indent=2))
        return 0
    if args.out is None:
        parser.error("--out is needed")
    plan = dict(DRY_PLAN if args.dry_run else GPU_PLAN)
    if args.budget_s:
        plan["budget_s"] = args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    work, pack = args.work.resolve(), args.pack.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    check = Check(args.out.resolve(), plan, args.dry_run)
    python = sys.executable
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(work / "site")]),
           "PATH": os.pathsep.join([str(work / "bin"), os.environ.get("PATH", "")]), "PYTHONUNBUFFERED": "1"}

    setup = check.run("setup", [python, "-m", "bench.gpu_check", "--unpack", "--pack", str(pack), "--work",
                                str(work)], env)
    check.measure("setup", setup, lambda: json.loads((work / "setup.json").read_text()))
    squad = work / "data" / "squad" / "v1.1"
    train = next((p for p in sorted(squad.glob("train-v1.1*.json"))), squad / "train-v1.1.json")
    dev = squad / "dev-v1.1.json"

    environment = check.run("environment", [python, "-m", "bench.gpu_environment", str(work / "environment.json")],
                            env)
    check.measure("environment", environment, lambda: json.loads((work / "environment.json").read_text()))
    cuda_provider = (environment or {}).get("metrics", {}).get("onnxruntime", {}).get("cuda_provider")

    model = work / "finetune"
    finetune = check.run("finetune", [python, "-m", "berth.cli", *finetune_command(
        plan, train, dev, work / "model", model, plan["finetune_minutes"], plan["max_eval_examples"])], env)
    check.measure("finetune", finetune, lambda: finetune_metrics(model))

    bundle = work / "bundle-fp16"
    if (finetune or {}).get("status") != "ok":
        check.skip("export", "needs the finetune phase's model")
    else:
        export = check.run("export", [
            python, "-m", "berth.cli", "export", str(model), "--out", str(bundle), "--precision", "fp16",
            "--device", "auto", "--data-dir", str(work / "data"), "--parity-examples", str(plan["parity_examples"]),
            "--metric-examples", str(plan["metric_examples"]), "--force",
            *(["--threads", str(plan["threads"])] if plan["threads"] else [])], env)
        check.measure("export", export, lambda: export_metrics(bundle, cuda_provider))

    if not (bundle / "bundle.json").is_file():
        check.skip("serve", "needs the export phase's bundle")
    elif plan["serve_device"] == "cuda" and not cuda_provider:
        check.skip("serve", "this onnxruntime has no CUDAExecutionProvider")
    elif shutil.which("hey", path=env["PATH"]) is None:
        check.skip("serve", "no `hey` load generator (pack with --with-hey)")
    else:
        serving = work / "serving.json"
        serve = check.run("serve", [
            python, "-m", "bench.gpu_serving", str(bundle), "--dev", str(dev), "--out", str(serving), "--device",
            plan["serve_device"], "--seconds", str(plan["serve_seconds"]), "--work", str(work / "serve"),
            "--batch-sizes", *map(str, plan["serve_batch_sizes"]), *(
                ["--threads", str(plan["threads"])] if plan["threads"] else [])], env)
        check.measure("serve", serve, lambda: serving_metrics(serving))

    log_before_ddp = check.log_path.stat().st_size
    ddp = check.run("ddp", [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                            str(plan["ddp_processes"]), "-m",
                            "berth.cli", *finetune_command(plan, train, dev, work / "model", work / "ddp",
                                                           plan["ddp_minutes"], plan["ddp_eval_examples"])], env)
    check.measure("ddp", ddp, lambda: {**finetune_metrics(work / "ddp"), "backend": ddp_backend(
        check.log_path.read_bytes()[log_before_ddp:].decode("utf-8", "replace"))})
    check.record["complete"] = True
    check.save()
    statuses = {name: phase["status"] for name, phase in check.record["phases"].items()}
    check.log(f"== done in {check.record['total_wall_s']} s: {json.dumps(statuses)}; record {check.json_path}")
    return 0 if all(status in ("ok", "skipped") for status in statuses.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
