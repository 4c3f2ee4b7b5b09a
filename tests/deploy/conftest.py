"""Deployment test fixtures: the repository's deploy configs, the real tools that check them
(prometheus, promtool, nginx, docker-compose, hadolint; installed by scripts/install-deploy-tools.sh),
one small real bundle, and `berth serve` replicas on loopback ports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

# (the local process helpers live with the benchmarks, which start the same servers; re-exported for these tests)
from bench.local_processes import free_port, stop_process, tail, wait_for  # noqa: F401
from tests.conftest import session_folder

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "berth.json"
PROMETHEUS_CONFIG = DOCKER / "prometheus" / "prometheus.yml"
NGINX_CONFIG = DOCKER / "nginx" / "nginx.conf"
MODEL = "sentiment"
# Small buckets and one ONNX Runtime thread per replica: two replicas, nginx, Prometheus and the
# client share two cores.
SERVE_ENV = {
    "BERTH_LENGTH_BUCKETS": "16,32,64",
    "BERTH_INTRA_OP_THREADS": "1",
    "BERTH_DEVICE": "cpu",
    "BERTH_MAX_BATCH_SIZE": "16",
    "BERTH_SHUTDOWN_TIMEOUT_S": "10",
}


def require_tool(name: str) -> str:
    """The path of a command-line tool, from PATH or the venv; skips the test when it is absent."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip(f"{name} is not installed (scripts/install-deploy-tools.sh installs it)")
    return found


class Replica:
    """`berth serve` on a fixed loopback port (so a killed replica can come back where nginx expects it)."""

    def __init__(self, repository: Path, log_dir: Path, name: str, port: int | None = None):
        self.repository, self.name = repository, name
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"{name}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> Replica:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
        env.update(SERVE_ENV, PYTHONUNBUFFERED="1")
        command = [sys.executable, "-m", "berth.cli", "serve", "--models", str(self.repository),
                   "--host", "127.0.0.1", "--port", str(self.port)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 180) -> Replica:
        assert self.process is not None
        wait_for(self.url + "/readyz", self.process, self.log, timeout)
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def served(self, route: str = "/v1/classify", status: str = "200") -> float:
        """berth_requests_total of `route` and `status` on this replica, read from its own /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.url + "/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            if family.name == "berth_requests":
                return sum(s.value for s in family.samples if s.name == "berth_requests_total"
                           and s.labels.get("route") == route and s.labels.get("status") == status)
        return 0.0

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)


@pytest.fixture(scope="session")
def deploy_repository(tmp_path_factory) -> Path:
    """A model repository with one real bundle: a seeded two-label classification head on the real
    all-MiniLM-L6-v2 checkpoint (max_seq_length 64), exported with the export package."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from export.bundle_builder import export_bundle
    from export.settings import ExportSettings
    from tasks.runtime.spec import TaskSpec
    from training.bert.checkpoint import default_base_path, load_pretrained, save_pretrained
    from training.bert.model import BertForSequenceClassification

    torch.set_num_threads(2)
    torch.manual_seed(0)
    root = session_folder(tmp_path_factory, "deploy-models")
    model, _ = load_pretrained(BertForSequenceClassification, default_base_path(),
                               id2label={0: "negative", 1: "positive"})
    nn.init.normal_(model.classifier.weight, std=0.5)
    model.eval()
    checkpoint = root / "checkpoint"
    save_pretrained(model, checkpoint, tokenizer_from=default_base_path())
    TaskSpec(task="classification", labels=["negative", "positive"], max_seq_length=64).save(checkpoint)
    export_bundle(ExportSettings(model_folder=checkpoint, out=root / "repository" / MODEL, precision="fp32",
                                 optimize="never", parity_examples=8, threads=2))
    return root / "repository"


@pytest.fixture(scope="session")
def deploy_server(deploy_repository, tmp_path_factory):
    """One `berth serve` replica, ready."""
    replica = Replica(deploy_repository, session_folder(tmp_path_factory, "deploy-logs"), "single").start()
    try:
        yield replica.wait_ready()
    finally:
        replica.stop()
