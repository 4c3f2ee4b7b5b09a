"""Infinity (`infinity-emb`, the embedding server users pick instead of berth) as a load-benchmark peer.

Infinity lives in its own venv (its pins clash with berth's: transformers < 5, sentence-transformers 3),
made once:

    python3.11 -m venv /tmp/infinity-venv
    /tmp/infinity-venv/bin/pip install "infinity-emb[server,torch,optimum]==0.0.78" "torch==2.13.0"

(`torch==2.13.0` in the same command keeps pip on the machine's CPU wheel instead of a CUDA build.) It serves
the checkpoint berth's embedding bundle was exported from, offline (no hub), as a subprocess of the benchmark:

- `--engine torch`: sentence-transformers on the checkpoint folder as it is;
- `--engine optimum`: ONNX Runtime through optimum; it needs a `model.onnx` at the folder's root. The
  benchmark copies the checkpoint to `<work>/infinity-onnx/` and exports it there with Infinity's own
  `optimum-cli export onnx --task feature-extraction --library-name transformers` (once), and starts
  Infinity inside that folder with
  `--model-id .` (it mishandles absolute paths to an ONNX folder) and `--pooling-method mean` (the engine
  pools the [CLS] vector unless told, where the checkpoint's sentence-transformers pooling is the mean).

It answers OpenAI's request at `/embeddings` (no /v1 prefix) and is ready when `GET /health` answers 200.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

ROUTE = "/embeddings"
ENGINES = ("optimum", "torch")


def unavailable(venv: Path) -> str | None:
    """Why Infinity cannot run from `venv`, or None."""
    if not (venv / "bin" / "infinity_emb").is_file():
        return (
            f"no infinity_emb in {venv} (python3.11 -m venv {venv} && {venv}/bin/pip install "
            "'infinity-emb[server,torch,optimum]==0.0.78' 'torch==2.13.0')"
        )
    return None


def version(venv: Path) -> dict[str, str]:
    """Versions of Infinity and the libraries under its engines, in its venv."""
    script = (
        "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
        "('infinity-emb', 'torch', 'onnxruntime', 'optimum', 'sentence-transformers', 'transformers')}))"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, timeout=120
    )
    import json

    return json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-500:]}


def offline_env(threads: int) -> dict[str, str]:
    """No hub, no telemetry, `threads` threads for torch / OpenMP."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }


def onnx_folder(venv: Path, checkpoint: Path, work: Path, threads: int) -> Path:
    """`work/infinity-onnx`: a copy of `checkpoint`, optimum's feature-extraction export at its root."""
    folder = work / "infinity-onnx"
    if not (folder / "model.onnx").is_file():
        shutil.copytree(checkpoint, folder, dirs_exist_ok=True)
        print(
            f"exporting {checkpoint} with optimum-cli for Infinity's optimum engine into {folder}", flush=True
        )
        subprocess.run(
            [
                str(venv / "bin" / "optimum-cli"),
                "export",
                "onnx",
                "--model",
                str(folder),
                "--task",
                "feature-extraction",
                "--library-name",
                "transformers",
                str(folder),
            ],
            check=True,
            env=offline_env(threads),
            timeout=900,
            capture_output=True,
        )
    return folder


def server(
    venv: Path, engine: str, checkpoint: Path, name: str, threads: int, work: Path, port: int
) -> tuple[int, Any]:
    """(port, a context manager running Infinity's `engine` on the checkpoint, served as `name`)."""
    from bench.local_processes import running

    folder = onnx_folder(venv, checkpoint, work, threads) if engine == "optimum" else checkpoint
    command = [
        str(venv / "bin" / "infinity_emb"),
        "v2",
        "--model-id",
        "." if engine == "optimum" else str(folder),
        "--engine",
        engine,
        "--device",
        "cpu",
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-vector-disk-cache",
    ]
    if (
        engine == "optimum"
    ):  # its default is the [CLS] vector; the checkpoint's pooling (1_Pooling/) is the mean
        command += ["--pooling-method", "mean"]
    return port, running(
        command,
        port,
        work / f"infinity-{engine}.log",
        ready_path="/health",
        cwd=folder,
        env=offline_env(threads),
    )
