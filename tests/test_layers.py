"""The import contracts of pyproject.toml ([tool.importlinter]: the layers, the torch-free packages, no import
circles) hold, as `lint-imports` (import-linter, the real tool) checks them over this source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_import_contract_is_kept():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    if not lint_imports.is_file():
        pytest.fail(f"{lint_imports} is missing: install the test extra (pip install -e '.[test]')")
    contracts = (tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
                 ["tool"]["importlinter"]["contracts"])
    # PYTHONPATH: the packages of this tree, whatever else is installed.
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    for contract in contracts:
        assert f"{contract['name']} KEPT" in report, report


def test_the_runtime_floor_contract_names_every_module_above_it():
    """The floor's contract lists the task layer's modules one by one (import-linter has no "all but"): a new
    module of tasks/ outside tasks/runtime/ must join the list, or the floor could import it unseen."""
    contracts = (tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
                 ["tool"]["importlinter"]["contracts"])
    floor = next(contract for contract in contracts if contract["id"] == "tasks-runtime-floor")
    above = {f"tasks.{path.stem}" for path in (ROOT / "tasks").glob("*.py") if path.stem != "__init__"}
    above |= {f"tasks.{path.name}" for path in (ROOT / "tasks").iterdir()
              if path.is_dir() and (path / "__init__.py").is_file() and path.name != "runtime"}
    assert floor["source_modules"] == ["tasks.runtime"]
    assert set(floor["forbidden_modules"]) == above


@pytest.mark.parametrize("module, planted, contract", [
    ("training/pretraining/corpus.py", "import training.finetuning.finetune", "pretraining-room"),
    ("training/pretraining/corpus.py", "import berth.sweep.run", "pretraining-room"),
    ("training/finetuning/task_data.py", "import training.pretraining.run", "finetuning-room"),
    ("training/finetuning/finetune.py", "import berth.sweep.grid", "finetuning-room"),
    ("training/loop/trainer.py", "import training.pretraining.run", "loop-knows-no-job"),
    ("training/bert/model.py", "import training.finetuning.task_data", "loop-knows-no-job"),
    ("predict/run.py", "from tasks.runtime.inference import run_items", "one-engine"),
    ("berth/api.py", "from tasks.runtime.onnx_session import create_session", "one-engine"),
])
def test_a_planted_import_breaks_its_contract(tmp_path, module, planted, contract):
    """Each room's contract fails on an import it forbids, planted in a copy of the tree."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    skip = shutil.ignore_patterns("results", "__pycache__", "*.png", "*.onnx")
    for name in ("berth", "export", "service", "training", "predict", "tasks", "bench", "tests"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / module, "a", encoding="utf-8") as f:
        f.write(f"\n{planted}  # planted\n")
    result = subprocess.run([str(lint_imports), "--no-cache", "--contract", contract], cwd=tmp_path, timeout=120,
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode != 0 and "BROKEN" in result.stdout, result.stdout + result.stderr
