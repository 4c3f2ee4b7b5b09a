"""The package stands alone: a wheel built from the checkout, installed with its `train,serve` extras into a fresh
virtual environment outside the checkout, builds a default bundle from the samples it carries and serves it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from bench.local_processes import free_port, running
from tests.conftest import REPO


def _run(command: list, cwd: Path, timeout: int = 900) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", REPO, "--no-deps", "--no-build-isolation", "-q", "-w", out], out)
    (built,) = out.glob("berth-*.whl")
    return built


def test_the_wheel_carries_what_the_commands_read(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    samples = {n for n in names if n.startswith("tasks/samples/")}
    shipped = {f"tasks/samples/{p.relative_to(REPO / 'data' / 'samples').as_posix()}"
               for p in (REPO / "data" / "samples").rglob("*") if p.is_file()}
    assert shipped and samples == shipped  # every shipped sample, nothing else
    assert {"berth/recipes/samples.yaml", "berth/py.typed", "service/static/index.html"} <= names
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


@pytest.mark.slow  # 5-16 minutes: installs torch and the extras from the registry, trains and exports a model
def test_a_fresh_venv_outside_the_checkout_builds_and_serves_a_default_bundle(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], tmp_path)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q"]
    _run([*pip, "torch==2.13.0"], tmp_path)  # the CPU wheel, as the Makefile installs it
    _run([*pip, f"berth[train,serve] @ {wheel.as_uri()}"], tmp_path)
    size = _run(["du", "-sm", venv], tmp_path).split()[0]
    print(f"a fresh venv with berth[train,serve]: {size} MiB")
    berth = venv / "bin" / "berth"
    # The build reads only what the wheel carries (cwd is outside the checkout); a short budget keeps it quick.
    out = _run([berth, "build-defaults", "--only", "topics", "--out", "models", "--work", "work",
                "--minutes-per-model", "0.2", "--threads", "2"], tmp_path, timeout=1200)
    assert [Path(p).name for p in json.loads(out)["built"]] == ["topics"], out
    manifest = json.loads((tmp_path / "models" / "topics" / "bundle.json").read_text())
    assert str(REPO) not in json.dumps(manifest)  # nothing of the build machine's checkout

    port = free_port()
    command = [str(berth), "serve", "--models", "models", "--port", str(port), "--threads", "1"]
    with running(command, port, tmp_path / "serve.log", timeout=300, cwd=tmp_path):
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/classify", method="POST",
                                         data=json.dumps({"model": "topics", "inputs": "Who painted the Mona Lisa?"})
                                         .encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
    gold = {json.loads(line)["label"] for line in (REPO / "data" / "samples" / "topics" / "dev.jsonl").open()}
    assert answer["results"][0]["label"] in gold
