"""berth predict test fixtures: the service tests' bundle repository (BERTH_TEST_REPOSITORY reuses a prebuilt
one) and a real `berth serve` over it, whose answers are what the offline tool must give."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import session_folder
from tests.service.conftest import REPO, ServerProcess


@pytest.fixture(scope="session")
def predict_server(bundle_repository, tmp_path_factory):
    proc = ServerProcess(bundle_repository, session_folder(tmp_path_factory, "predict-logs") / "serve.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def http(predict_server):
    with httpx.Client(base_url=predict_server.url, timeout=300) as c:
        yield c


def run_predict(*args: str, check: bool = True, threads: int = 2) -> tuple[int, dict | None, str]:
    """`berth predict ARGS` in a subprocess: (exit code, the JSON summary, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    command = [sys.executable, "-m", "berth.cli", "predict", *args, "--threads", str(threads)]
    done = subprocess.run(command, cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    if check and done.returncode != 0:
        raise AssertionError(f"berth predict exited {done.returncode}:\n{done.stderr[-4000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    return done.returncode, summary, done.stderr


def read_output(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path
