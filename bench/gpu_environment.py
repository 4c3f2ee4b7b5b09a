"""The accelerator facts a GPU check records first: the GPU, its driver, torch's CUDA build, ONNX Runtime's providers.

    python -m bench.gpu_environment OUT.json

Each fact is read on its own, so a missing piece (no nvidia-smi, a CPU-only torch) is recorded as missing, not fatal.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.machine import machine_facts

LIBRARIES = ("torch", "onnxruntime", "onnxruntime-gpu", "onnx", "transformers", "tokenizers", "numpy", "pydantic",
             "fastapi", "uvicorn", "orjson")


def nvidia_smi() -> list[dict[str, str]] | str:
    """One row per GPU (name, driver, memory), or why there is none."""
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found"
    fields = ("name", "driver_version", "memory.total", "compute_cap")
    done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"nvidia-smi failed: {(done.stderr or done.stdout).strip()[-500:]}"
    return [dict(zip(fields, (v.strip() for v in line.split(",")))) for line in done.stdout.splitlines() if line]


def torch_facts() -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {"version": torch.__version__, "cuda_build": torch.version.cuda,
                             "cuda_available": torch.cuda.is_available()}
    if facts["cuda_available"]:
        facts.update(device_name=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                     capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                     bf16_supported=torch.cuda.is_bf16_supported(),
                     nccl=".".join(map(str, torch.cuda.nccl.version())))
    return facts


def onnxruntime_facts() -> dict[str, Any]:
    import onnxruntime

    providers = onnxruntime.get_available_providers()
    return {"version": onnxruntime.__version__, "providers": providers,
            "cuda_provider": "CUDAExecutionProvider" in providers}


def environment() -> dict[str, Any]:
    facts: dict[str, Any] = {"machine": machine_facts(None, LIBRARIES), "gpus": nvidia_smi()}
    for name, probe in (("torch", torch_facts), ("onnxruntime", onnxruntime_facts)):
        try:
            facts[name] = probe()
        except Exception as error:  # a broken install is a fact to record, not a reason to stop
            facts[name] = {"error": f"{type(error).__name__}: {error}"}
    return facts


def main(argv: list[str] | None = None) -> int:
    out = Path((argv or sys.argv[1:])[0])
    facts = environment()
    out.write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
