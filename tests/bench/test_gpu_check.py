"""The GPU check (scripts/gpu_check.sh) run end to end on this CPU in its dry-run mode, so it cannot rot before a GPU
runs it: a pack built by bench/gpu_pack.py's own functions (the real base in fp16, a tiny SQuAD slice), every phase
a real subprocess (berth finetune, torchrun, berth export's fp16 parity gate, berth serve under hey)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnxruntime
import pytest

from bench.gpu_pack import check_size, pack_model, pack_squad

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "data" / "samples" / "squad"
PHASES = ["setup", "environment", "finetune", "export", "serve", "ddp"]  # ddp last: the budget can best lose it
# the dry-run plan's slice, as bench/gpu_check.py's DRY_PLAN states it
TRAIN_EXAMPLES, EVAL_EXAMPLES, DDP_EVAL_EXAMPLES, DDP_PROCESSES, STEPS = 24, 16, 8, 2, 3


def questions(squad: dict) -> int:
    return sum(len(p["qas"]) for article in squad["data"] for p in article["paragraphs"])


def run_check(pack: Path, out: Path, work: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry-run", "--pack", str(pack), "--out",
                           str(out), "--work", str(work)], env={**os.environ, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tiny_squad(tmp_path_factory, base_path) -> tuple[Path, dict[str, int]]:
    """A pack: the real base's weights in fp16, xz; two articles of each shipped SQuAD sample file, xz."""
    root = tmp_path_factory.mktemp("gpu-pack")
    source = root / "source" / "squad" / "v1.1"
    source.mkdir(parents=True)
    counts = {}
    for name, sample in (("train-v1.1.json", "train.json"), ("dev-v1.1.json", "dev.json")):
        squad = json.loads((SAMPLES / sample).read_text(encoding="utf-8"))
        squad["data"] = squad["data"][:2]
        (source / name).write_text(json.dumps(squad), encoding="utf-8")
        counts[name] = questions(squad)
    pack = root / "pack"
    pack_squad(source, pack / "data" / "squad" / "v1.1")
    pack_model(base_path, pack / "model")
    return pack, counts


@pytest.fixture(scope="module")
def dry_run(tiny_squad, tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    root = tmp_path_factory.mktemp("gpu-check")
    done = run_check(tiny_squad[0], root / "out", root / "work")
    return done, json.loads((root / "out" / "gpu_check.json").read_text(encoding="utf-8"))


@pytest.mark.slow  # the whole dry run of the GPU check on the CPU: about 2 minutes
def test_every_phase_runs_and_passes_on_the_cpu(dry_run) -> None:
    done, record = dry_run
    statuses = {name: phase["status"] for name, phase in record["phases"].items()}
    tails = {name: phase.get("error_tail", phase.get("reason")) for name, phase in record["phases"].items()
             if phase["status"] != "ok"}
    assert list(statuses) == PHASES and set(statuses.values()) == {"ok"}, (statuses, tails)
    assert done.returncode == 0 and record["complete"] and record["mode"] == "dry-run"
    assert all(0 < phase["wall_s"] <= phase["limit_s"] for phase in record["phases"].values())


@pytest.mark.slow  # the whole dry run of the GPU check on the CPU: about 2 minutes
def test_finetune_trains_the_slice_and_scores_the_dev_questions(dry_run, tiny_squad) -> None:
    metrics = dry_run[1]["phases"]["finetune"]["metrics"]
    counts = tiny_squad[1]
    assert metrics["train_questions"] == min(TRAIN_EXAMPLES, counts["train-v1.1.json"])
    assert metrics["dev_questions"] == min(EVAL_EXAMPLES, counts["dev-v1.1.json"])
    assert metrics["steps"] == STEPS and metrics["world_size"] == 1 and metrics["precision"] == "fp32"
    assert 0 <= metrics["exact"] <= metrics["f1"] <= 100
    assert metrics["tokens_per_s"] > 0 and metrics["train_minutes"] >= 0


@pytest.mark.slow  # the whole dry run of the GPU check on the CPU: about 2 minutes
def test_the_torchrun_path_joins_a_process_group(dry_run, tiny_squad) -> None:
    metrics = dry_run[1]["phases"]["ddp"]["metrics"]
    assert metrics["backend"] == "gloo"  # torch.distributed's CPU backend; NCCL where the device is CUDA
    assert metrics["world_size"] == DDP_PROCESSES and 1 <= metrics["steps"] <= STEPS  # an epoch of shards may be less
    assert metrics["dev_questions"] == min(DDP_EVAL_EXAMPLES, tiny_squad[1]["dev-v1.1.json"])


@pytest.mark.slow  # the whole dry run of the GPU check on the CPU: about 2 minutes
def test_fp16_export_passes_its_gate_on_the_provider_this_onnxruntime_has(dry_run) -> None:
    metrics = dry_run[1]["phases"]["export"]["metrics"]
    cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert metrics["onnxruntime_cuda_provider"] is cuda
    assert metrics["parity_provider"] == ("CUDAExecutionProvider" if cuda else "CPUExecutionProvider")
    assert metrics["precision"] == "fp16" and metrics["passed"] is True
    assert metrics["metric"]["passed"] is True and metrics["metric"]["examples"] == 16


@pytest.mark.slow  # the whole dry run of the GPU check on the CPU: about 2 minutes
def test_serving_is_measured_beside_the_raw_engine(dry_run) -> None:
    metrics = dry_run[1]["phases"]["serve"]["metrics"]
    assert metrics["device"] == "cpu" and metrics["engine_provider"] == "CPUExecutionProvider"
    assert metrics["engine_best_items_per_s"] > 0 and metrics["engine_best_batch"] in (1, 4)
    assert set(metrics["berth_items_per_s"]) == {"1", "32"}  # JSON keys: the client counts
    assert all(rate > 0 for rate in metrics["berth_items_per_s"].values())


@pytest.mark.slow  # the whole dry run of the GPU check on the CPU: about 2 minutes
def test_environment_records_torch_and_the_onnxruntime_providers(dry_run) -> None:
    facts = dry_run[1]["phases"]["environment"]["metrics"]
    assert facts["onnxruntime"]["providers"] == onnxruntime.get_available_providers()
    assert facts["torch"]["cuda_available"] is False and facts["torch"]["version"].startswith("2.")
    if shutil.which("nvidia-smi") is None:
        assert facts["gpus"] == "nvidia-smi not found"


def test_a_failed_phase_is_recorded_and_the_independent_ones_still_run(tiny_squad, tmp_path) -> None:
    broken = tmp_path / "pack"
    shutil.copytree(tiny_squad[0] / "data", broken / "data")  # no model/: fine-tuning cannot start
    done = run_check(broken, tmp_path / "out", tmp_path / "work")
    record = json.loads((tmp_path / "out" / "gpu_check.json").read_text(encoding="utf-8"))
    phases = record["phases"]
    assert done.returncode == 1 and record["complete"]
    assert phases["environment"]["status"] == "ok" and phases["setup"]["status"] == "ok"
    for name in ("finetune", "ddp"):
        # the one-line refusal of a base that is not a checkpoint (its end: the tail keeps the last characters)
        assert phases[name]["status"] == "failed" and "a BERT checkpoint folder holds config.json" in \
            phases[name]["error_tail"]
    assert phases["export"] == {"status": "skipped", "reason": "needs the finetune phase's model"}
    assert phases["serve"]["status"] == "skipped"
    assert "== finetune: failed" in (tmp_path / "out" / "gpu_check.log").read_text(encoding="utf-8")


def test_the_size_check_fails_above_the_limit_and_names_the_biggest_file(tmp_path) -> None:
    (tmp_path / "big.bin").write_bytes(b"\0" * (2 * 1024 * 1024))
    (tmp_path / "small.txt").write_bytes(b"x" * 1024)
    command = [sys.executable, "-m", "bench.gpu_pack", "--check", str(tmp_path)]
    over = subprocess.run([*command, "--limit-mib", "1.5"], capture_output=True, text=True, cwd=REPO)
    assert over.returncode == 1 and "over the 1.5 MiB limit" in over.stderr and "big.bin 2.0 MiB" in over.stderr
    under = subprocess.run([*command, "--limit-mib", "3"], capture_output=True, text=True, cwd=REPO)
    assert under.returncode == 0 and "2.0 MiB in 2 files" in under.stdout
    with pytest.raises(SystemExit):  # what travels beside the pack counts too
        check_size(tmp_path, 3, beside_bytes=1024 * 1024)


@pytest.mark.slow
def test_the_real_pack_fits_beside_the_working_tree(tmp_path, shared_data) -> None:
    """Needs PyPI (the wheels) and the shared data folder."""
    out = tmp_path / "gpu_pack"
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_pack.sh"), "--out", str(out), "--data-dir",
                           str(shared_data)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((out / "pack.json").read_text(encoding="utf-8"))
    assert manifest["pack_mib"] < manifest["with_working_tree_mib"] <= 64 and manifest["squad"][1] == "dev-v1.1.json"
    assert {"pydantic", "pydantic_core", "fastapi", "starlette", "uvicorn", "httptools", "orjson"} <= {
        name.split("-")[0] for name in manifest["wheels"]}
    assert all("cp312" in name or "py3-none" in name or "abi3" in name for name in manifest["wheels"])
