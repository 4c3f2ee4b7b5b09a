"""Settings from the environment and flags, the torch-free import, and refusing a bad repository."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from pydantic import ValidationError

from service.settings import ServiceSettings
from tests.service.conftest import REPO


def test_settings_defaults_env_and_overrides():
    default = ServiceSettings.from_env({})
    assert default.max_batch_size == 32 and default.api_key is None and default.length_buckets[0] == 16
    env = {"BERTH_MAX_BATCH_SIZE": "8", "BERTH_MODEL_NAMES": "a, b", "BERTH_LENGTH_BUCKETS": "[64, 16, 32]",
           "BERTH_API_KEY": "secret", "BERTH_WARMUP": "false", "UNRELATED": "x"}
    settings = ServiceSettings.from_env(env, max_batch_size=4, port=None)
    assert settings.max_batch_size == 4  # a flag beats the environment
    assert settings.model_names == ["a", "b"] and settings.length_buckets == [16, 32, 64]
    assert settings.warmup is False and settings.port == 8000
    assert settings.api_key.get_secret_value() == "secret" and settings.describe()["api_key"] == "***"
    with pytest.raises(ValidationError):
        ServiceSettings.from_env({"BERTH_MAX_BATCH_SIZE": "zero"})
    with pytest.raises(ValidationError):
        ServiceSettings.from_env({}, max_batch_tokens=8)  # below the smallest bucket


def test_importing_the_service_does_not_import_torch():
    code = ("import sys, service.app, berth.commands.serve, service.routes; "
            "from service.app import create_app; create_app(); "
            "assert 'torch' not in sys.modules, 'torch was imported'; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_serve_refuses_an_altered_bundle_naming_the_file(bundle_repository, tmp_path):
    repository = tmp_path / "models"
    shutil.copytree(bundle_repository / "sentiment", repository / "sentiment")
    with open(repository / "sentiment" / "tokenizer.json", "r+b") as f:  # same size, one byte changed
        first = f.read(1)
        f.seek(0)
        f.write(b"[" if first != b"[" else b"{")
    for args, expected in (([], "tokenizer.json"), (["--model", "missing"], "missing")):
        result = subprocess.run([sys.executable, "-m", "berth.cli", "serve", "--models", str(repository), "--port", "0",
                                 *args], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert result.returncode == 2
        assert expected in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["../sentiment/model.onnx", "/etc/hostname", "sub/../../x", "C:\\x", "a\\..\\b"])
def test_a_manifest_naming_a_file_outside_its_bundle_is_refused(bundle_repository, tmp_path, name):
    repository = tmp_path / "models"
    shutil.copytree(bundle_repository / "sentiment", repository / "sentiment")
    manifest_path = repository / "sentiment" / "bundle.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][name] = dict(manifest["files"]["tokenizer.json"])
    manifest_path.write_text(json.dumps(manifest))
    result = subprocess.run([sys.executable, "-m", "berth.cli", "serve", "--models", str(repository), "--port", "0"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "not a plain relative path inside the bundle" in result.stderr and repr(name) in result.stderr


def test_the_bytes_loaded_are_the_bytes_verified(bundle_repository, tmp_path):
    """A file changed after discovery (between the hash check and the session) is refused, not loaded."""
    from service.metrics import Metrics
    from service.models import RepositoryError, load_model
    from tasks.bundle_checks import load_bundle

    folder = tmp_path / "sentiment"
    shutil.copytree(bundle_repository / "sentiment", folder)
    bundle = load_bundle(folder, verify_hashes=True)
    data = bytearray((folder / "model.onnx").read_bytes())
    data[-1] ^= 1  # same size, one bit flipped
    (folder / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(RepositoryError, match="model.onnx changed since it was verified"):
        load_model(bundle, ServiceSettings(device="cpu", warmup=False), Metrics())


def test_bundles_with_the_same_tokenizer_file_share_one_tokenizer(bundle_repository, tmp_path):
    """Equal tokenizer.json files load once per process; a changed file is still refused, shared or not."""
    from service.models import RepositoryError, load_bundle_tokenizer
    from tasks.bundle_checks import load_bundle
    from tasks.runtime.tokenizer import load_tokenizer

    shared: dict = {}
    first = load_bundle_tokenizer(load_bundle(bundle_repository / "sentiment"), shared)
    assert load_bundle_tokenizer(load_bundle(bundle_repository / "entities"), shared) is first
    assert len(shared) == 1
    text = "Cupertino-based Apple hired 1,200 naïve engineers."
    reference = load_tokenizer(bundle_repository / "entities" / "tokenizer.json").encode(text)
    assert first.encode(text).ids == reference.ids and first.encode(text).offsets == reference.offsets

    folder = tmp_path / "similarity"
    shutil.copytree(bundle_repository / "similarity", folder)
    bundle = load_bundle(folder, verify_hashes=True)
    (folder / "tokenizer.json").write_text((folder / "tokenizer.json").read_text().replace("[UNK]", "[UNX]", 1))
    with pytest.raises(RepositoryError, match="tokenizer.json changed since it was verified"):
        load_bundle_tokenizer(bundle, shared)


def test_healthz_does_not_echo_the_failure(bundle_repository):
    from starlette.testclient import TestClient

    from service.app import create_app
    from service.runtime import Phase, Runtime

    runtime = Runtime(ServiceSettings(models=bundle_repository))
    runtime.phase, runtime.failure = Phase.FAILED, "OSError: /secret/path/model.onnx: permission denied"
    response = TestClient(create_app(runtime.settings, runtime)).get("/healthz")  # no lifespan: nothing loads
    assert response.status_code == 503 and response.json() == {"status": "failed"}
