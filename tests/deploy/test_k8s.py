"""The Kubernetes manifests (docker/k8s/): rendered by the real `kubectl kustomize`, validated against
the Kubernetes API schemas (kubernetes-validate), scanned by checkov, and held against a live
`berth serve` started with the Deployment's own environment, so the probes, the port, the metric
the autoscaler reads and the drain timing cannot drift from the code."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from service.settings import ServiceSettings
from tests.deploy.conftest import MODEL, REPO, free_port, require_tool, stop_process, tail, wait_for
from tests.deploy.k8s_manifests import (
    K8S,
    VARIANTS,
    berth_container,
    container_env,
    cpu_cores,
    only,
    port_number,
    prestop_seconds,
    rendered,
    rendered_text,
)

NAMESPACE = "berth"
EXPECTED_KINDS = {"Namespace", "ServiceAccount", "PersistentVolumeClaim", "Deployment", "Service",
                  "NetworkPolicy", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ServiceMonitor"}
# Kubernetes versions the manifests are validated for: the oldest they rely on (the PDB's
# unhealthyPodEvictionPolicy is on by default from 1.27) and the newest kubernetes-validate knows.
OLDEST_KUBERNETES = "1.27"
# Kinds kubernetes-validate has no schema for (they are CRDs, not core APIs), skipped by name there and
# validated by test_servicemonitor_validates_against_the_operator_schema instead; their wiring to the
# core objects is checked in test_manifests_wire_together and against the live server.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
# BERTH_* variables the Deployment may set before berth reads them: the drain delay of the
# serving-hardening issue (#13, `drain_delay_s` on its branch). A berth without the setting ignores
# the variable (no drain delay); once it has it, the variable is checked like every other.
PENDING_SETTINGS = {"drain_delay_s"}
ADAPTER = K8S / "prometheus-adapter"
BUNDLE_LOADER = K8S / "bundle-loader.yaml"  # applied on its own (`kubectl apply -f`), not by kustomize
CHECKED = [*VARIANTS, "bundle-loader"]  # what the schema and checkov tests cover


def objects_of(name: str) -> list[dict]:
    if name == "bundle-loader":
        return [doc for doc in yaml.safe_load_all(BUNDLE_LOADER.read_text()) if doc]
    return rendered(name)


def settings_fields() -> set[str]:
    return set(ServiceSettings.model_fields)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_renders(variant):
    objects = rendered(variant)
    kinds = {obj["kind"] for obj in objects}
    expected = EXPECTED_KINDS - ({"PersistentVolumeClaim"} if "models-from-image" in variant else set())
    assert kinds == expected, variant
    for obj in objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == NAMESPACE, f"{obj['kind']} outside {NAMESPACE}"
    image = berth_container(objects)["image"]
    assert image == ("berth:gpu" if variant.startswith("gpu") else "berth:cpu")


def test_gpu_overlay_asks_for_a_gpu_and_cuda():
    container = berth_container(rendered("gpu"))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container_env(container)["BERTH_DEVICE"] == "auto"
    assert ServiceSettings.from_env(container_env(container)).device == "auto"
    cpu_container = berth_container(rendered("cpu"))
    assert "nvidia.com/gpu" not in cpu_container["resources"]["limits"]
    assert container_env(cpu_container)["BERTH_DEVICE"] == "cpu"


def test_models_from_image_component_copies_before_berth_starts():
    pod = only(rendered("cpu+models-from-image"), "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "models")
    assert "emptyDir" in volume and "persistentVolumeClaim" not in volume
    (init,) = pod["initContainers"]
    target = next(m["mountPath"] for m in init["volumeMounts"] if m["name"] == "models")
    assert init["command"][-1].rstrip("/") == target  # copies into the volume berth then reads
    mount = next(m for m in berth_container(rendered("cpu+models-from-image"))["volumeMounts"] if m["name"] == "models")
    assert mount["readOnly"] is True


def test_bundle_loader_writes_where_berth_reads():
    loader = only(objects_of("bundle-loader"), "Pod")
    base = rendered("cpu")
    assert loader["metadata"]["namespace"] == NAMESPACE
    (volume,) = loader["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == only(base, "PersistentVolumeClaim")["metadata"]["name"]
    (mount,) = loader["spec"]["containers"][0]["volumeMounts"]
    assert mount["name"] == volume["name"] and not mount.get("readOnly")
    berth_pod = only(base, "Deployment")["spec"]["template"]["spec"]
    assert loader["spec"]["securityContext"]["runAsUser"] == berth_pod["securityContext"]["runAsUser"]
    # the berth pods' NetworkPolicy does not cover the loader; its own denies everything
    policies = [o for o in objects_of("bundle-loader") if o["kind"] == "NetworkPolicy"]
    assert [selects(p["spec"]["podSelector"]["matchLabels"], loader["metadata"]["labels"]) for p in policies] == [True]
    assert not policies[0]["spec"].get("ingress") and not policies[0]["spec"].get("egress")


# -- schemas --------------------------------------------------------------------------------------------

def kubernetes_validate():
    try:
        import kubernetes_validate
    except ImportError:
        pytest.skip("kubernetes-validate is not installed (scripts/install-deploy-tools.sh installs it)")
    return kubernetes_validate


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, "latest"])
@pytest.mark.parametrize("variant", CHECKED)
def test_manifests_validate_against_kubernetes_schemas(variant, version):
    kv = kubernetes_validate()
    version = kv.latest_version() if version == "latest" else version
    skipped = []
    for obj in objects_of(variant):
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            skipped.append(obj["kind"])
            continue
        try:
            kv.validate(obj, version, strict=True)  # strict: unknown fields (typos) fail too
        except kv.ValidationError as error:
            pytest.fail(f"{variant}: {obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {version}: "
                        f"{'.'.join(map(str, error.path))}: {error.message}")
    assert skipped == ([] if variant == "bundle-loader" else ["ServiceMonitor"])


def test_schema_validation_catches_a_broken_deployment():
    """The validator is not a rubber stamp: a misspelt field and a wrong type are refused."""
    kv = kubernetes_validate()
    deployment = only(rendered("cpu"), "Deployment")
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {"path": "/readyz"}
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "sixty"
    for broken in (typo, wrong_type):
        with pytest.raises(kv.ValidationError):
            kv.validate(broken, kv.latest_version(), strict=True)


def validate_servicemonitors(objects: list[dict]) -> subprocess.CompletedProcess:
    """The Prometheus Operator's schema, as the npm package @kubernetes-models/prometheus-operator
    ships it (installed under the venv by scripts/install-deploy-tools.sh), run by node."""
    node = require_tool("node")
    prefix = Path(sys.prefix) / "opt" / "node-models"
    if not (prefix / "node_modules" / "@kubernetes-models" / "prometheus-operator").is_dir():
        pytest.skip("@kubernetes-models/prometheus-operator is not installed (scripts/install-deploy-tools.sh "
                    "installs it where npm is available)")
    return subprocess.run([node, str(Path(__file__).parent / "validate_servicemonitor.mjs"), str(prefix)],
                          input=json.dumps(objects), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("variant", VARIANTS)
def test_servicemonitor_validates_against_the_operator_schema(variant):
    monitors = [obj for obj in rendered(variant) if (obj["apiVersion"], obj["kind"]) in CRD_KINDS]
    result = validate_servicemonitors(monitors)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["ok", "berth"]


def test_operator_schema_catches_a_broken_servicemonitor():
    monitor = only(rendered("cpu"), "ServiceMonitor")
    port_as_number, bad_interval = copy.deepcopy(monitor), copy.deepcopy(monitor)
    port_as_number["spec"]["endpoints"][0]["port"] = 8000  # must be the Service port's name
    bad_interval["spec"]["endpoints"][0]["interval"] = "15 seconds"
    for broken in (port_as_number, bad_interval):
        result = validate_servicemonitors([broken])
        assert result.returncode == 1 and result.stdout.startswith("invalid berth"), result.stdout + result.stderr


# -- checkov --------------------------------------------------------------------------------------------

CHECKOV_SKIP = re.compile(r"^(CKV2?_K8S_\d+)=([^=]+)$")  # checkov splits on "=": one only


def checkov_skips(objects: list[dict]) -> dict[str, str]:
    """check id -> reason, from the `checkov.io/skip*` annotations of every object."""
    skips = {}
    for obj in objects:
        for key, value in (obj["metadata"].get("annotations") or {}).items():
            if key.startswith("checkov.io/skip"):
                match = CHECKOV_SKIP.match(value)
                assert match, f"{obj['kind']}: checkov skip without the form CHECK_ID=reason: {value!r}"
                skips[match.group(1)] = match.group(2)
    return skips


def run_checkov(files: list[Path]) -> dict[str, dict]:
    """checkov's kubernetes results per file: failed and skipped (check id, resource, reason given) and
    the number passed."""
    binary = require_tool("checkov")
    command = [binary, "--framework", "kubernetes", "--output", "json", "--compact", "--skip-download",
               *[arg for f in files for arg in ("-f", str(f))]]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "LOG_LEVEL": "ERROR"})
    assert result.returncode in (0, 1), result.stderr[-3000:]  # 1: some check failed
    reports = json.loads(result.stdout)
    reports = [r for r in (reports if isinstance(reports, list) else [reports]) if r.get("check_type") == "kubernetes"]
    assert len(reports) == 1 and not reports[0]["results"]["parsing_errors"], result.stdout[-3000:]
    results = reports[0]["results"]
    out: dict[str, dict] = {str(f): {"failed": [], "skipped": [], "passed": 0} for f in files}
    for check in results["failed_checks"]:
        out[check["file_abs_path"]]["failed"].append((check["check_id"], check["resource"]))
    for check in results["skipped_checks"]:
        out[check["file_abs_path"]]["skipped"].append(
            (check["check_id"], check["resource"], check["check_result"].get("suppress_comment", "")))
    for check in results["passed_checks"]:
        out[check["file_abs_path"]]["passed"] += 1
    return out


@pytest.fixture(scope="module")
def checkov_results(tmp_path_factory) -> tuple[dict[str, dict], dict[str, Path]]:
    """One checkov run over every variant, plus a Deployment with its hardening taken out (so the
    scan is seen to bite)."""
    tmp = tmp_path_factory.mktemp("checkov")
    files = {}
    for variant in VARIANTS:
        files[variant] = tmp / f"{variant}.yaml"
        files[variant].write_text(rendered_text(variant))
    files["bundle-loader"] = tmp / BUNDLE_LOADER.name
    files["bundle-loader"].write_text(BUNDLE_LOADER.read_text())
    weakened = only(rendered("cpu"), "Deployment")
    container = weakened["spec"]["template"]["spec"]["containers"][0]
    del container["securityContext"], container["livenessProbe"], container["resources"]["limits"]
    files["weakened"] = tmp / "weakened.yaml"
    files["weakened"].write_text(yaml.safe_dump(weakened))
    return run_checkov(list(files.values())), files


@pytest.mark.parametrize("variant", CHECKED)
def test_checkov_finds_nothing_unexplained(variant, checkov_results):
    results, files = checkov_results
    result = results[str(files[variant])]
    assert result["passed"] > 20, result  # checkov did scan the objects
    assert not result["failed"], f"{variant}: checkov failures: {result['failed']}"
    reasons = checkov_skips(objects_of(variant))
    assert {check_id for check_id, _, _ in result["skipped"]} == set(reasons)
    for check_id, resource, comment in result["skipped"]:
        assert comment == reasons[check_id], (check_id, resource)
        assert len(comment.split()) >= 8, f"{check_id} on {resource}: the reason is too short: {comment!r}"


def test_checkov_fails_a_deployment_without_its_hardening(checkov_results):
    results, files = checkov_results
    failed = {check_id for check_id, _ in results[str(files["weakened"])]["failed"]}
    # read-only root fs, no privilege escalation, capabilities dropped, liveness probe, limits
    assert {"CKV_K8S_22", "CKV_K8S_20", "CKV_K8S_37", "CKV_K8S_8", "CKV_K8S_11", "CKV_K8S_13"} <= failed, failed


# -- wiring and hardening -------------------------------------------------------------------------------

def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("variant", VARIANTS)
def test_manifests_wire_together(variant):
    objects = rendered(variant)
    deployment, service = only(objects, "Deployment"), only(objects, "Service")
    monitor, hpa = only(objects, "ServiceMonitor"), only(objects, "HorizontalPodAutoscaler")
    pdb, policy = only(objects, "PodDisruptionBudget"), only(objects, "NetworkPolicy")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    container = berth_container(objects)

    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    assert selects(service["spec"]["selector"], pod_labels)
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert selects(policy["spec"]["podSelector"]["matchLabels"], pod_labels)
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    assert hpa["spec"]["minReplicas"] >= 2 and pdb["spec"]["maxUnavailable"] == 1

    (service_port,) = service["spec"]["ports"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service_port["name"]
    assert port_number(container, service_port["targetPort"]) == int(container_env(container)["BERTH_PORT"])
    assert {p["port"] for p in policy["spec"]["ingress"][0]["ports"]} == {service_port["targetPort"]}

    if "models-from-image" not in variant:
        claim = only(objects, "PersistentVolumeClaim")["metadata"]["name"]
        volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "models")
        assert volume["persistentVolumeClaim"]["claimName"] == claim
    models_mount = next(m for m in container["volumeMounts"] if m["name"] == "models")
    assert models_mount["mountPath"] == container_env(container)["BERTH_MODELS"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_pod_is_hardened(variant):
    objects = rendered(variant)
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] >= 10000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"] + pod.get("initContainers", []):
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"] and "add" not in context["capabilities"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][kind]), (container["name"], kind)
    tmp = next(m for m in berth_container(objects)["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    namespace = only(objects, "Namespace")["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_berth_variable_is_a_real_setting(variant):
    env = container_env(berth_container(rendered(variant)))
    fields = settings_fields()
    for name in env:
        assert name.startswith("BERTH_"), name
        field = name.removeprefix("BERTH_").lower()
        assert field in fields or field in PENDING_SETTINGS, f"{name} is not a berth setting"
    known = {k: v for k, v in env.items() if k.removeprefix("BERTH_").lower() in fields}
    settings = ServiceSettings.from_env(known)  # valid values, as `berth serve` would read them
    assert settings.intra_op_threads == math.ceil(
        cpu_cores(berth_container(rendered(variant))["resources"]["limits"]["cpu"]))


# -- the drain timing chain -----------------------------------------------------------------------------

def drain_chain(container: dict) -> tuple[float, float, float]:
    """(preStop, drain delay, shutdown timeout) in seconds, as this Deployment and this berth set them."""
    env = container_env(container)
    defaults = ServiceSettings.model_fields

    def setting(field: str) -> float:
        name = "BERTH_" + field.upper()
        if name in env:
            return float(env[name])
        return float(defaults[field].default) if field in defaults else 0.0

    return prestop_seconds(container), setting("drain_delay_s"), setting("shutdown_timeout_s")


@pytest.mark.parametrize("variant", VARIANTS)
def test_drain_fits_into_the_grace_period(variant):
    """preStop + drain delay + shutdown timeout < terminationGracePeriodSeconds, with room for
    uvicorn's own graceful wait (up to the shutdown timeout again when connections linger)."""
    objects = rendered(variant)
    container = berth_container(objects)
    grace = only(objects, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    prestop, drain_delay, shutdown = drain_chain(container)
    assert prestop >= 3, "preStop gives Services and ingress controllers a few seconds to drop the pod"
    assert shutdown > 0
    assert prestop + drain_delay + shutdown < grace
    assert prestop + drain_delay + 2 * shutdown <= grace


# -- the manifests against a live server ----------------------------------------------------------------

class ManifestServer:
    """`berth serve` started with the cpu overlay's environment: only the repository, the interface
    and the port are replaced (the port through BERTH_PORT, as in the pod, not through a flag)."""

    def __init__(self, repository: Path, log: Path):
        self.container = berth_container(rendered("cpu"))
        self.env = container_env(self.container)
        self.port = free_port()
        self.env.update(BERTH_MODELS=str(repository), BERTH_HOST="127.0.0.1", BERTH_PORT=str(self.port))
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
        with open(log, "wb") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "berth.cli", "serve"], cwd=REPO,
                                            env={**inherited, **self.env, "PYTHONUNBUFFERED": "1"},
                                            stdout=out, stderr=subprocess.STDOUT)

    def probe_url(self, probe: str) -> str:
        get = self.container[probe]["httpGet"]
        assert port_number(self.container, get["port"]) == int(container_env(self.container)["BERTH_PORT"])
        return self.url + get["path"]


@pytest.fixture(scope="module")
def manifest_server(deploy_repository, tmp_path_factory):
    server = ManifestServer(deploy_repository, tmp_path_factory.mktemp("k8s-server") / "berth.log")
    started = time.monotonic()
    try:
        wait_for(server.probe_url("startupProbe"), server.process, server.log, timeout=180)
        server.ready_after_s = time.monotonic() - started
        yield server
    finally:
        stop_process(server.process, timeout=60)


def test_probes_answer_on_the_live_server(manifest_server):
    container = manifest_server.container
    window = container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"]
    assert manifest_server.ready_after_s < window
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        response = httpx.get(manifest_server.probe_url(probe), timeout=container[probe]["timeoutSeconds"])
        assert response.status_code == 200, (probe, response.text)
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert httpx.get(manifest_server.probe_url("readinessProbe")).json()["status"] == "ready"
    assert httpx.get(manifest_server.probe_url("livenessProbe")).json()["status"] == "alive"


def live_metrics(url: str) -> dict[str, list]:
    """metric family name -> samples, from the server's /metrics (Prometheus text format)."""
    return {family.name: family.samples
            for family in text_string_to_metric_families(httpx.get(url, timeout=10).text)}


def test_autoscaling_metric_is_exported_per_model(manifest_server):
    objects = rendered("cpu")
    monitor, hpa = only(objects, "ServiceMonitor"), only(objects, "HorizontalPodAutoscaler")
    (endpoint,) = monitor["spec"]["endpoints"]
    families = live_metrics(manifest_server.url + endpoint["path"])
    pods_metrics = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert pods_metrics == ["berth_queue_depth"]
    assert {m["resource"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Resource"} == {"cpu"}
    for name in pods_metrics:
        assert name in families, f"the HPA scales on {name}, which berth does not export"
        samples = [s for s in families[name] if s.name == name]
        assert {s.labels.get("model") for s in samples} == {MODEL}
        assert all(math.isfinite(s.value) and s.value >= 0 for s in samples)


def test_adapter_rule_serves_the_hpa_metric():
    rules = yaml.safe_load((ADAPTER / "rules.yaml").read_text())["rules"]
    values = yaml.safe_load((ADAPTER / "values.yaml").read_text())
    assert values["rules"]["custom"] == rules, "values.yaml and rules.yaml must carry the same rule"
    hpa = only(rendered("cpu"), "HorizontalPodAutoscaler")
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    served = set()
    for rule in rules:
        series = re.match(r"(\w+)\{", rule["seriesQuery"]).group(1)
        assert re.fullmatch(rule["name"]["matches"], series)
        served.add(rule["name"].get("as") or series)
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    assert wanted <= served


def adapter_query(rule: dict, namespace: str, pods: list[str]) -> str:
    """The PromQL prometheus-adapter sends for a pods metric request (its Go template filled in)."""
    series = re.match(r"(\w+)\{", rule["seriesQuery"]).group(1)
    matchers = f'namespace="{namespace}",pod=~"{"|".join(pods)}"'
    return (rule["metricsQuery"].replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)
            .replace("<<.GroupBy>>", "pod"))


def test_adapter_query_on_real_prometheus_follows_the_queue(manifest_server, tmp_path):
    """Debian's prometheus scrapes the live server with the labels the Prometheus Operator adds
    (namespace, pod); the adapter's query for the pod must return its queue depth: 0 when idle, above
    0 while a burst waits."""
    binary = require_tool("prometheus")
    pod = "berth-7d9f8-abcde"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "berth", "metrics_path": "/metrics", "static_configs": [{
            "targets": [f"127.0.0.1:{manifest_server.port}"], "labels": {"namespace": NAMESPACE, "pod": pod}}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port, log = free_port(), tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={tmp_path / 'data'}",
                                    f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                   stdout=out, stderr=subprocess.STDOUT)
    (rule,) = yaml.safe_load((ADAPTER / "rules.yaml").read_text())["rules"]
    promql = adapter_query(rule, NAMESPACE, [pod])
    prometheus = f"http://127.0.0.1:{port}"

    def queue_depth() -> float | None:
        body = httpx.get(prometheus + "/api/v1/query", params={"query": promql}, timeout=10).json()
        assert body["status"] == "success", body
        result = body["data"]["result"]
        if not result:
            return None
        (sample,) = result
        assert sample["metric"] == {"pod": pod}  # one value per pod, as the custom metrics API serves it
        return float(sample["value"][1])

    try:
        wait_for(prometheus + "/-/ready", process, log, timeout=60)
        deadline = time.monotonic() + 30
        while queue_depth() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert queue_depth() == 0.0, tail(log)
        series = httpx.get(prometheus + "/api/v1/series", params={"match[]": rule["seriesQuery"]}, timeout=10)
        assert {s["model"] for s in series.json()["data"]} == {MODEL}
        burst = Burst(manifest_server.url, clients=4, inputs=64, rounds=6)
        with burst:
            deadline = time.monotonic() + 40
            peak = 0.0
            while time.monotonic() < deadline and peak == 0.0 and not burst.done:
                peak = max(peak, queue_depth() or 0.0)
                time.sleep(0.5)
            while peak == 0.0 and time.monotonic() < deadline:  # the last scrapes of the burst
                peak = max(peak, queue_depth() or 0.0)
                time.sleep(0.5)
        assert burst.statuses and set(burst.statuses) == {200}, burst.statuses
        assert peak > 0, "the adapter's query never saw the queue under a burst"
    finally:
        stop_process(process)


class Burst:
    """`clients` threads, each posting `rounds` requests of `inputs` texts to /v1/classify (bounded)."""

    def __init__(self, url: str, clients: int, inputs: int, rounds: int):
        self.url, self.inputs, self.rounds = url, inputs, rounds
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, client: int) -> None:
        texts = [f"review {client}-{i}: the film was a fine and moving piece of work" for i in range(self.inputs)]
        with httpx.Client(base_url=self.url, timeout=60) as http:
            for _ in range(self.rounds):
                try:
                    self.statuses.append(http.post("/v1/classify", json={"inputs": texts}).status_code)
                except httpx.TransportError as error:
                    self.errors.append(repr(error))

    @property
    def done(self) -> bool:
        return not any(t.is_alive() for t in self.threads)

    def __enter__(self) -> Burst:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        for thread in self.threads:
            thread.join(90)


def items_submitted_and_computed(url: str) -> tuple[float, float]:
    """(items that entered a queue: waiting now or already taken into a batch; items computed), from
    /metrics. Both include the warm-up's, if any: callers compare differences."""
    families = live_metrics(url + "/metrics")

    def total(family: str, sample: str) -> float:
        return sum(s.value for s in families[family] if s.name == sample)

    submitted = total("berth_queue_depth", "berth_queue_depth") + total("berth_queue_wait_seconds",
                                                                        "berth_queue_wait_seconds_count")
    return submitted, total("berth_items_inferred", "berth_items_inferred_total")


def wait_queued(url: str, base: tuple[float, float], items: int, timeout: float) -> tuple[float, float]:
    """Wait until `items` more items than at `base` entered the queue; returns (submitted, computed)
    since `base`."""
    base_submitted, base_computed = base
    deadline = time.monotonic() + timeout
    while True:
        submitted, computed = items_submitted_and_computed(url)
        if submitted - base_submitted >= items or time.monotonic() > deadline:
            assert submitted - base_submitted >= items, f"{submitted - base_submitted} of {items} queued in {timeout} s"
            return submitted - base_submitted, computed - base_computed
        time.sleep(0.02)


def test_sigterm_with_requests_in_flight_drains_within_the_budget(deploy_repository, tmp_path):
    """A server with the Deployment's settings, SIGTERM while requests are queued (what the kubelet
    sends after preStop): every admitted request is answered 200, and the process exits 0 within
    drain delay + shutdown timeout, the part of the grace period that is berth's. Where berth has the
    drain delay, the probes and a late request are checked during it too."""
    server = ManifestServer(deploy_repository, tmp_path / "berth.log")
    try:
        wait_for(server.probe_url("readinessProbe"), server.process, server.log, timeout=180)
        _, drain_delay, shutdown = drain_chain(server.container)
        burst = Burst(server.url, clients=4, inputs=64, rounds=1)
        base = items_submitted_and_computed(server.url)
        with burst:
            queued, computed = wait_queued(server.url, base, 4 * 64, timeout=60)
            assert computed < queued, "everything was computed before SIGTERM: make the burst larger"
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            if "drain_delay_s" in ServiceSettings.model_fields and drain_delay >= 2:
                # During the drain delay the kubelet sees not-ready (never dead: no restart), and a
                # request that still arrives is served.
                time.sleep(0.2)
                during = (httpx.get(server.probe_url("readinessProbe"), timeout=3).status_code,
                          httpx.get(server.probe_url("livenessProbe"), timeout=3).status_code,
                          httpx.post(server.url + "/v1/classify", json={"inputs": "late but welcome"},
                                     timeout=60).status_code)
                assert during == (503, 200, 200), during
            code = server.process.wait(timeout=drain_delay + shutdown + 30)
            elapsed = time.monotonic() - started
        assert code == 0, tail(server.log)
        assert burst.statuses == [200] * 4 and not burst.errors, (burst.statuses, burst.errors)
        assert elapsed <= drain_delay + shutdown + 2, f"exit took {elapsed:.1f} s"
    finally:
        stop_process(server.process)
