"""A real `berth serve` with BERTH_BUNDLE_PUBLIC_KEY: a signed bundle is served (answers checked against
PyTorch on the same fine-tuned folder); a tampered, unsigned or foreign-signed one stops the start with
exit code 2 and a message naming the bundle. Keys and signatures come from the real `berth sign-bundle`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.service import reference
from tests.service.conftest import REPO, ServerProcess

SENTENCES = ["A charming and often affecting journey.", "Unflinchingly bleak and desperate."]


def sign_bundle(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "berth.cli", "sign-bundle", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("keys")
    sign_bundle("--new-key", str(folder / "signing.pem"))
    sign_bundle("--new-key", str(folder / "other.pem"))
    return {"private": folder / "signing.pem", "public": folder / "signing.pub.pem",
            "other": folder / "other.pem"}


@pytest.fixture(scope="module")
def signed_repository(bundle_repository, keys, tmp_path_factory) -> Path:
    repository = tmp_path_factory.mktemp("signed") / "repository"
    shutil.copytree(bundle_repository / "sentiment", repository / "sentiment")
    sign_bundle(str(repository / "sentiment"), "--key", str(keys["private"]))
    return repository


def test_a_signed_bundle_is_served(signed_repository, keys, checkpoints, tmp_path):
    server = ServerProcess(signed_repository, tmp_path / "signed.log",
                           env={"BERTH_BUNDLE_PUBLIC_KEY": str(keys["public"])})
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert [m["name"] for m in client.get("/v1/models").json()["models"]] == ["sentiment"]
            response = client.post("/v1/classify", json={"inputs": SENTENCES})
            assert response.status_code == 200, response.text
            got = [result["label"] for result in response.json()["results"]]
        assert got == [want["label"] for want in reference.classify(checkpoints["sentiment"], SENTENCES)]
    finally:
        assert server.stop() == 0, server.log()


def tamper_label(bundle: Path, keys: dict[str, Path]) -> None:
    manifest = json.loads((bundle / "bundle.json").read_text())
    manifest["labels"] = manifest["labels"][::-1]
    (bundle / "bundle.json").write_text(json.dumps(manifest, indent=2))


def unsign(bundle: Path, keys: dict[str, Path]) -> None:
    manifest = json.loads((bundle / "bundle.json").read_text())
    del manifest["signature"]
    (bundle / "bundle.json").write_text(json.dumps(manifest, indent=2))


def sign_with_the_other_key(bundle: Path, keys: dict[str, Path]) -> None:
    sign_bundle(str(bundle), "--key", str(keys["other"]))


@pytest.mark.parametrize("damage,reason", [
    (tamper_label, "bundle.json was edited after export: its digest"),
    (unsign, "not signed"),
    (sign_with_the_other_key, "signed by another key"),
])
def test_serve_refuses_to_start_on_an_untrusted_bundle(signed_repository, keys, tmp_path, damage, reason):
    repository = tmp_path / "repository"
    shutil.copytree(signed_repository / "sentiment", repository / "sentiment")
    damage(repository / "sentiment", keys)
    server = ServerProcess(repository, tmp_path / "refused.log", env={"BERTH_BUNDLE_PUBLIC_KEY": str(keys["public"])})
    try:
        code = server.process.wait(timeout=120)
    finally:
        server.stop()
    log = server.log()
    assert code == 2, log
    assert "berth serve: bundle sentiment: " in log and reason in log and "Traceback" not in log
