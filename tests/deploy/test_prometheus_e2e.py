"""Real Prometheus against a real `berth serve`: Debian's prometheus binary runs the repository's
scrape config and alert rules (target rewritten to the loopback replica, 1 s scrapes), traffic flows,
and every PromQL expression of the Grafana dashboard must be valid and return data, so the
dashboard cannot drift from the metrics the service exports."""

from __future__ import annotations

import json
import math
import re
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.deploy.conftest import (
    DASHBOARD,
    DOCKER,
    MODEL,
    PROMETHEUS_CONFIG,
    free_port,
    require_tool,
    stop_process,
    wait_for,
)

RATE_INTERVAL = "10s"  # what $__rate_interval stands for here: 10 scrapes at 1 s


def dashboard_panels(panels: list[dict]) -> list[dict]:
    """Every panel, including those nested in collapsed rows."""
    out = []
    for panel in panels:
        out.append(panel)
        out.extend(dashboard_panels(panel.get("panels", [])))
    return out


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title / refId, PromQL) for every target of every panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(f"{panel['title']} / {target['refId']}", target["expr"])
            for panel in dashboard_panels(dashboard["panels"]) for target in panel.get("targets", [])]


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's variables replaced as Grafana would: `$__rate_interval` and the template variables."""
    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise AssertionError(f"unknown Grafana variable ${name} in {expr}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, expr)


def test_dashboard_has_queries():
    queries = dashboard_queries()
    assert len(queries) >= 15
    assert all(expr.strip() for _, expr in queries)


def scrape_config_for(target: str, tmp: Path) -> Path:
    """The repository's prometheus.yml with the berth job pointed at `target`, 1 s intervals, the
    repository's rule files by absolute path, and no other job."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str((PROMETHEUS_CONFIG.parent / name).resolve()) for name in config["rule_files"]]
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == "berth"]
    assert len(jobs) == 1, "prometheus.yml needs exactly one job named berth"
    job = jobs[0]
    for key in [k for k in job if k.endswith("_sd_configs")]:
        del job[key]
    job["static_configs"] = [{"targets": [target]}]
    config["scrape_configs"] = [job]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def prometheus(deploy_server, tmp_path_factory):
    binary = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    config = scrape_config_for(f"127.0.0.1:{deploy_server.port}", tmp)
    port = free_port()
    log = tmp / "prometheus.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url + "/-/ready", process, log, timeout=60)
        yield url
    finally:
        stop_process(process)


class Traffic:
    """Requests to the replica from a background thread until stopped (bounded in time and count):
    classify lists and single texts, plus a few that must fail (unknown model 404, bad input 422, a
    too long text with truncate=false 413), so the error panels have something to show."""

    def __init__(self, url: str, max_seconds: float = 90, max_requests: int = 3000):
        self.url, self.max_seconds, self.max_requests = url, max_seconds, max_requests
        self.sent, self.statuses = 0, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        bodies = [
            {"inputs": ["a fine film", "a dull and tedious mess", "it was fine, I guess"]},
            {"inputs": "one text on its own", "model": MODEL},
            {"inputs": ["x"], "model": "no-such-model"},
            {"inputs": ["ok"], "top_k": "many"},
            {"inputs": " ".join(["word"] * 200), "truncate": False, "model": MODEL},
        ]
        deadline = time.monotonic() + self.max_seconds
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set() and time.monotonic() < deadline and self.sent < self.max_requests:
                body = bodies[self.sent % len(bodies)]
                status = client.post("/v1/classify", json=body).status_code
                self.statuses[status] = self.statuses.get(status, 0) + 1
                self.sent += 1
                time.sleep(0.01)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)


def query(prometheus: str, expr: str) -> dict:
    response = httpx.get(prometheus + "/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", f"invalid PromQL {expr!r}: {body}"
    return body["data"]


def has_data(data: dict) -> bool:
    """A non-empty result with at least one number (NaN would mean no traffic in the window)."""
    values = [sample["value"][1] for sample in data["result"]] if data["resultType"] == "vector" else []
    if data["resultType"] == "scalar":
        values = [data["result"][1]]
    return any(math.isfinite(float(v)) for v in values)


def test_every_dashboard_query_returns_data(deploy_server, prometheus):
    queries = dashboard_queries()
    selections = {  # "All" (Grafana's allValue), then the one model and replica actually served
        "all": {"__rate_interval": RATE_INTERVAL, "model": ".*", "instance": ".*"},
        "one": {"__rate_interval": RATE_INTERVAL, "model": MODEL, "instance": f"127.0.0.1:{deploy_server.port}"},
    }
    with Traffic(deploy_server.url) as traffic:
        for values in selections.values():  # valid PromQL at once, even before any data
            for _, expr in queries:
                query(prometheus, substitute(expr, values))
        missing: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            missing = [f"[{name}] {title}: {substitute(expr, values)}"
                       for name, values in selections.items() for title, expr in queries
                       if not has_data(query(prometheus, substitute(expr, values)))]
            if not missing:
                break
            time.sleep(1)
    assert traffic.statuses.get(200, 0) > 0, traffic.statuses
    assert {404, 422, 413} <= set(traffic.statuses), traffic.statuses
    assert not missing, "dashboard queries without data:\n" + "\n".join(missing)


def test_dashboard_variables_resolve(deploy_server, prometheus):
    """The template variables' label_values() queries, as Grafana runs them (series API)."""
    dashboard = json.loads(DASHBOARD.read_text())
    expected = {"model": MODEL, "instance": f"127.0.0.1:{deploy_server.port}"}
    for variable in dashboard["templating"]["list"]:
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["definition"])
        assert match, variable["definition"]
        selector, label = match.groups()
        deadline = time.monotonic() + 30
        while True:
            response = httpx.get(f"{prometheus}/api/v1/label/{label}/values", params={"match[]": selector}, timeout=10)
            assert response.json()["status"] == "success", response.text
            if expected[variable["name"]] in response.json()["data"] or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert expected[variable["name"]] in response.json()["data"], (variable["name"], response.json())


def test_target_up_and_alert_rules_evaluate(deploy_server, prometheus):
    """The scrape job reaches the replica, and every alert rule of alerts.yml is loaded and evaluates
    without error against the real metrics."""
    deadline = time.monotonic() + 30
    while True:
        targets = httpx.get(prometheus + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        groups = httpx.get(prometheus + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        settled = targets and all(t["health"] == "up" for t in targets) and rules and \
            all(rule["health"] == "ok" for rule in rules)
        if settled or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert [t["labels"]["job"] for t in targets] == ["berth"]
    assert all(t["health"] == "up" for t in targets), targets
    defined = yaml.safe_load((DOCKER / "prometheus" / "alerts.yml").read_text())
    names = {rule["alert"] for group in defined["groups"] for rule in group["rules"]}
    assert {rule["name"] for rule in rules} == names
    assert all(rule["health"] == "ok" and not rule.get("lastError") for rule in rules), rules
    firing = [rule["name"] for rule in rules if rule["state"] == "firing"]
    assert "BerthReplicaDown" not in firing and "BerthModelNotReady" not in firing
