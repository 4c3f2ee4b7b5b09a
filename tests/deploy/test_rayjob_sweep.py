"""The KubeRay RayJob of `berth sweep --ray` (docker/k8s/rayjob-sweep.yaml), checked as the predict one is
(tests/deploy/test_rayjob.py): its core objects and every pod template against the Kubernetes API schemas
(kubernetes-validate, strict), the RayJob's own fields against the KubeRay ray.io/v1 field names, the
restricted pod security, and its entrypoint parsed by berth's own command line; and the sweep's storage:
the head and every worker mount one shared volume holding the data and the sweep folder."""

from __future__ import annotations

import shlex
import tomllib

import pytest
import yaml

from berth.cli import build_parser
from tests.deploy.conftest import REPO
from tests.deploy.k8s_manifests import K8S, only
from tests.deploy.test_k8s import OLDEST_KUBERNETES
from tests.deploy.test_rayjob import (
    CLUSTER_SPEC,
    HEAD_SPEC,
    RAYJOB_SPEC,
    WORKER_SPEC,
    assert_restricted_pod,
    check_against_kubernetes_schemas,
    pod_templates,
)

RAYJOB = K8S / "rayjob-sweep.yaml"


def objects() -> list[dict]:
    return [doc for doc in yaml.safe_load_all(RAYJOB.read_text()) if doc]


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, "latest"])
def test_sweep_rayjob_validates_against_kubernetes_schemas(version):
    check_against_kubernetes_schemas(objects(), version, "worker cpu")


def test_sweep_rayjob_uses_only_kuberay_fields_and_an_allowed_ray_version():
    job = only(objects(), "RayJob")
    assert job["metadata"]["namespace"] == "berth"
    assert set(job["spec"]) <= RAYJOB_SPEC
    cluster = job["spec"]["rayClusterSpec"]
    assert set(cluster) <= CLUSTER_SPEC and set(cluster["headGroupSpec"]) <= HEAD_SPEC
    for group in cluster["workerGroupSpecs"]:
        assert set(group) <= WORKER_SPEC and group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        assert all(isinstance(value, str) for value in group["rayStartParams"].values())
    assert all(isinstance(value, str) for value in cluster["headGroupSpec"]["rayStartParams"].values())
    from packaging.specifiers import SpecifierSet

    (requirement,) = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ray"]
    assert "tune" in requirement.split("]", 1)[0]  # the extra brings Ray Tune, which the sweep runs on
    assert cluster["rayVersion"] in SpecifierSet(requirement.split("]", 1)[1])


def test_sweep_rayjob_pods_meet_the_restricted_pod_security():
    for name, template in pod_templates(only(objects(), "RayJob")).items():
        assert_restricted_pod(name, template["spec"])


def test_sweep_rayjob_entrypoint_is_a_berth_sweep_on_ray_over_one_shared_volume():
    job = only(objects(), "RayJob")
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["berth", "sweep"]
    args = build_parser().parse_args(argv[1:])  # every flag is one berth sweep takes
    assert args.ray == "auto" and args.num_threads >= 1 and args.grid and args.restarts >= 1
    claim = only(objects(), "PersistentVolumeClaim")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]  # one volume mounted by pods on many nodes
    cluster = job["spec"]["rayClusterSpec"]
    pods = {"head": cluster["headGroupSpec"]["template"]["spec"],
            **{g["groupName"]: g["template"]["spec"] for g in cluster["workerGroupSpecs"]}}
    for name, pod in pods.items():  # the driver and every trial see the same files at the same paths
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v}
        mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
        for path in (args.train_file, args.dev_file, args.out):
            mount = next(p for p in mounts if str(path).startswith(p + "/"))
            assert claims[mounts[mount]["name"]] == claim["metadata"]["name"], (name, path)
            assert not mounts[mount].get("readOnly"), name  # trials write their folders there
    for group in cluster["workerGroupSpecs"]:
        limit = group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
        assert float(limit) >= args.num_threads, "a trial asks --threads CPUs of a worker"
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
