"""docker/healthcheck.py, the images' HEALTHCHECK, run against a real `berth serve`."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.deploy.conftest import DOCKER, free_port

SCRIPT = DOCKER / "healthcheck.py"


def run_healthcheck(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    return subprocess.run([sys.executable, str(SCRIPT)], env={**clean, **env}, capture_output=True, text=True,
                          timeout=30)


def test_healthy_when_ready(deploy_server):
    assert run_healthcheck(BERTH_PORT=str(deploy_server.port)).returncode == 0


def test_unhealthy_when_not_listening():
    result = run_healthcheck(BERTH_PORT=str(free_port()))
    assert result.returncode == 1 and "not ready" in result.stderr


def test_unhealthy_on_an_error_status(deploy_server):
    """A non-200 answer (as /readyz's 503 while warming up or draining) is unhealthy."""
    result = run_healthcheck(BERTH_HEALTHCHECK_URL=deploy_server.url + "/readyz-does-not-exist")
    assert result.returncode == 1 and "404" in result.stderr
