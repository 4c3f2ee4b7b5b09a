"""Settings from the environment and flags, the torch-free import, and refusing a bad repository."""

from __future__ import annotations

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
    code = ("import sys, service.app, service.cli, service.routes; "
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
