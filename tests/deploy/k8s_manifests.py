"""The Kubernetes manifests of docker/k8s/, rendered with the real `kubectl kustomize` and read back as
objects, plus the few ways the tests look into them (the berth container, its environment, its probes)."""

from __future__ import annotations

import functools
import math
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import DOCKER, require_tool

K8S = DOCKER / "k8s"
OVERLAYS = sorted(path.parent.name for path in (K8S / "overlays").glob("*/kustomization.yaml"))
COMPONENTS = sorted(path.parent.name for path in (K8S / "components").glob("*/kustomization.yaml"))
# Every overlay on its own, and the CPU overlay with each component (what docs/DEPLOY.md describes).
VARIANTS = [*OVERLAYS, *(f"cpu+{component}" for component in COMPONENTS)]
MIN_KUSTOMIZE_MAJOR = 4  # `resources:` naming directories, `patches:`, components (kubectl >= 1.21)


@functools.cache
def kubectl() -> str:
    """kubectl with a kustomize new enough for the manifests; skips the test otherwise."""
    binary = require_tool("kubectl")
    out = subprocess.run([binary, "version", "--client"], capture_output=True, text=True).stdout
    match = re.search(r"Kustomize Version: v(\d+)", out)
    if not match or int(match.group(1)) < MIN_KUSTOMIZE_MAJOR:
        pytest.skip(f"{binary} embeds an old kustomize ({out.strip()!r}); the manifests need kustomize "
                    f">= v{MIN_KUSTOMIZE_MAJOR} (kubectl >= 1.21; Debian 12's kubernetes-client is 1.20)")
    return binary


def kustomize(directory: Path) -> str:
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True)
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return result.stdout


@functools.cache
def rendered_text(variant: str) -> str:
    """The variant's manifests as `kubectl kustomize` prints them (what `kubectl apply -k` sends)."""
    overlay, _, component = variant.partition("+")
    if not component:
        return kustomize(K8S / "overlays" / overlay)
    # A user's overlay of its own: kustomize wants relative paths from the kustomization's folder.
    with tempfile.TemporaryDirectory() as tmp:
        relative = functools.partial(os.path.relpath, start=tmp)
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump({
            "resources": [relative(K8S / "overlays" / overlay)],
            "components": [relative(K8S / "components" / component)],
        }))
        return kustomize(Path(tmp))


def rendered(variant: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(rendered_text(variant)) if doc]


def only(objects: list[dict], kind: str) -> dict:
    found = [obj for obj in objects if obj["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def berth_container(objects: list[dict]) -> dict:
    containers = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "berth")


def cpu_cores(quantity: str) -> float:
    """A Kubernetes CPU quantity ("2", "1.5", "500m") in cores."""
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def container_env(container: dict) -> dict[str, str]:
    """The container's environment as the kubelet would set it, where the test can tell: literal
    values; limits.cpu through the downward API (rounded up to the divisor, as the kubelet does);
    optional Secret references left out (no Secret exists in a fresh namespace)."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
            continue
        source = var["valueFrom"]
        if "resourceFieldRef" in source:
            field = source["resourceFieldRef"]
            assert field["resource"] == "limits.cpu", field
            cores = cpu_cores(container["resources"]["limits"]["cpu"]) / cpu_cores(str(field.get("divisor", "1")))
            env[var["name"]] = str(math.ceil(cores))
        elif "secretKeyRef" in source:
            assert source["secretKeyRef"].get("optional") is True, f"{var['name']}: a required Secret"
        else:
            raise AssertionError(f"{var['name']}: a source the tests do not know: {source}")
    return env


def port_number(container: dict, port: int | str) -> int:
    """A probe's or Service's port (a number or a container port's name) as a number."""
    if isinstance(port, int):
        return port
    names = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port in names, f"port {port!r} is not a port of the container ({names})"
    return names[port]


def prestop_seconds(container: dict) -> float:
    """How long the preStop hook holds the pod before SIGTERM (a `sleep` hook, exec or native)."""
    hook = container.get("lifecycle", {}).get("preStop")
    if hook is None:
        return 0.0
    if "sleep" in hook:
        return float(hook["sleep"]["seconds"])
    command = hook["exec"]["command"]
    assert command[0] in ("sleep", "/bin/sleep") and len(command) == 2, f"preStop is not a plain sleep: {command}"
    return float(command[1])
