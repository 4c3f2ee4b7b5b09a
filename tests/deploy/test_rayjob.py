"""The KubeRay RayJob of `berth predict --ray` (docker/k8s/rayjob-predict.yaml): its core objects and every
pod template in it against the Kubernetes API schemas (kubernetes-validate, strict), the RayJob's own fields
against the KubeRay ray.io/v1 field names (no registry package ships KubeRay's CRD schema, so like the
ServiceMonitor it is skipped by kind in the core-schema check), the namespace's restricted pod security,
and its entrypoint parsed by berth's own command line."""

from __future__ import annotations

import copy
import shlex
import tomllib

import pytest
import yaml

from berth.cli import build_parser
from tests.deploy.conftest import REPO
from tests.deploy.k8s_manifests import K8S, only, rendered
from tests.deploy.test_k8s import OLDEST_KUBERNETES, kubernetes_validate

RAYJOB = K8S / "rayjob-predict.yaml"
CRD_KINDS = {("ray.io/v1", "RayJob")}
# The KubeRay v1 RayJob fields this manifest may use (ray.io_rayjobs.yaml, KubeRay 1.1 and later).
RAYJOB_SPEC = {
    "entrypoint",
    "submissionMode",
    "shutdownAfterJobFinishes",
    "ttlSecondsAfterFinished",
    "activeDeadlineSeconds",
    "backoffLimit",
    "submitterPodTemplate",
    "rayClusterSpec",
    "runtimeEnvYAML",
    "entrypointNumCpus",
    "suspend",
    "jobId",
    "metadata",
    "clusterSelector",
}
CLUSTER_SPEC = {"rayVersion", "headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling"}
HEAD_SPEC = {"rayStartParams", "template", "serviceType"}
WORKER_SPEC = {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template"}


def objects() -> list[dict]:
    return [doc for doc in yaml.safe_load_all(RAYJOB.read_text()) if doc]


def pod_templates(job: dict) -> dict[str, dict]:
    cluster = job["spec"]["rayClusterSpec"]
    templates = {
        "submitter": job["spec"]["submitterPodTemplate"],
        "head": cluster["headGroupSpec"]["template"],
    }
    for group in cluster["workerGroupSpecs"]:
        templates[f"worker {group['groupName']}"] = group["template"]
    return templates


def as_pod(name: str, template: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name.replace(" ", "-"), "namespace": "berth", **template.get("metadata", {})},
        "spec": template["spec"],
    }


def check_against_kubernetes_schemas(found: list[dict], version: str, broken_group: str) -> None:
    """A RayJob manifest's core objects and its pod templates (as Pods) validate strictly against `version`'s
    schemas; `broken_group`'s template with a misspelt field does not (the check bites)."""
    assert {(o["apiVersion"], o["kind"]) for o in found} == {*CRD_KINDS, ("v1", "PersistentVolumeClaim")}
    core = [o for o in found if (o["apiVersion"], o["kind"]) not in CRD_KINDS]
    check_core_objects_and_pods(core, pod_templates(only(found, "RayJob")), version, broken_group)


def check_core_objects_and_pods(core: list[dict], templates: dict[str, dict], version: str, broken: str) -> None:
    """Core objects and pod templates (as Pods) validate strictly against `version`'s schemas; the template named
    `broken` with a misspelt field does not (the check bites). Shared by the manifests of custom resources whose
    pods are plain pod templates (the RayJobs, the PyTorchJob)."""
    kv = kubernetes_validate()
    version = kv.latest_version() if version == "latest" else version
    for obj in [*core, *(as_pod(name, template) for name, template in templates.items())]:
        try:
            kv.validate(obj, version, strict=True)
        except kv.ValidationError as error:
            pytest.fail(
                f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {version}: "
                f"{'.'.join(map(str, error.path))}: {error.message}"
            )
    misspelt = as_pod(broken.split()[0], copy.deepcopy(templates[broken]))
    misspelt["spec"]["containers"][0]["volumeMount"] = misspelt["spec"]["containers"][0].pop("volumeMounts")
    with pytest.raises(kv.ValidationError):  # the check bites on a misspelt field
        kv.validate(misspelt, version, strict=True)


def assert_restricted_pod(name: str, pod: dict) -> None:
    """A pod spec that the restricted Pod Security Standard admits, with limits and a writable /tmp of its own in
    every container (init containers too), as every pod of docker/k8s/ is."""
    context = pod["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] >= 10000, name
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
    assert pod["automountServiceAccountToken"] is False, name
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True, name
        assert security["capabilities"]["drop"] == ["ALL"] and "add" not in security["capabilities"], name
        assert {"cpu", "memory"} <= set(container["resources"]["limits"]), name
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == mounts["/tmp"]), name


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, "latest"])
def test_rayjob_validates_against_kubernetes_schemas(version):
    check_against_kubernetes_schemas(objects(), version, "head")


def test_rayjob_uses_only_kuberay_fields():
    job = only(objects(), "RayJob")
    assert job["metadata"]["namespace"] == "berth"
    assert set(job["spec"]) <= RAYJOB_SPEC
    cluster = job["spec"]["rayClusterSpec"]
    assert set(cluster) <= CLUSTER_SPEC and set(cluster["headGroupSpec"]) <= HEAD_SPEC
    for group in cluster["workerGroupSpecs"]:
        assert set(group) <= WORKER_SPEC
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    for params in [
        cluster["headGroupSpec"]["rayStartParams"],
        *(g["rayStartParams"] for g in cluster["workerGroupSpecs"]),
    ]:
        assert all(isinstance(value, str) for value in params.values()), "rayStartParams values are strings"


def test_rayjob_ray_version_is_one_the_ray_extra_allows():
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ray"]
    from packaging.specifiers import SpecifierSet

    (requirement,) = extra
    allowed = SpecifierSet(requirement.split("]", 1)[1])
    assert only(objects(), "RayJob")["spec"]["rayClusterSpec"]["rayVersion"] in allowed


def test_rayjob_pods_meet_the_restricted_pod_security():
    for name, template in pod_templates(only(objects(), "RayJob")).items():
        assert_restricted_pod(name, template["spec"])


def test_rayjob_entrypoint_is_a_berth_predict_on_ray_reading_the_model_repository():
    job = only(objects(), "RayJob")
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["berth", "predict"]
    args = build_parser().parse_args(argv[1:])  # every flag is one berth predict takes
    assert args.ray == "auto" and args.threads >= 1
    head = pod_templates(job)["head"]["spec"]
    mounts = {m["mountPath"]: m for m in head["containers"][0]["volumeMounts"]}
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in head["volumes"]
        if "persistentVolumeClaim" in v
    }
    models = only(rendered("cpu"), "PersistentVolumeClaim")["metadata"]["name"]
    bundle_mount = next(path for path in mounts if str(args.bundle).startswith(path + "/"))
    assert claims[mounts[bundle_mount]["name"]] == models and mounts[bundle_mount]["readOnly"] is True
    data_claim = only(objects(), "PersistentVolumeClaim")["metadata"]["name"]
    for path in (args.input, args.out):
        mount = next(p for p in mounts if str(path).startswith(p + "/"))
        assert claims[mounts[mount]["name"]] == data_claim
    # the workers mount neither: Ray sends them the bundle and the rows
    for group in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        assert not any("persistentVolumeClaim" in v for v in group["template"]["spec"]["volumes"])
        limit = group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
        assert float(limit) >= args.threads, "an actor asks --threads CPUs of a worker"
    assert job["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
