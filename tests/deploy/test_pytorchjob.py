"""The Kubeflow PyTorchJob of `berth pretrain` on two machines (docker/k8s/pytorchjob-pretrain.yaml): its volume claim
and pod templates against the Kubernetes API schemas (kubernetes-validate, strict, as the RayJobs), the whole job
against the training operator's own API models (the kubeflow-training SDK, generated from the operator's OpenAPI
schema: every field name and value type, down into the pod templates), the restricted pod security, and its
commands parsed by the real parsers: torchrun's arguments by torch's, berth's by berth's, the preparation and the
training agreeing on the data."""

from __future__ import annotations

import copy

import pytest
import yaml

from berth.cli import build_parser
from berth.config_files import settings_from_args
from tests.deploy.k8s_manifests import K8S, only
from tests.deploy.test_k8s import OLDEST_KUBERNETES
from tests.deploy.test_rayjob import assert_restricted_pod, check_core_objects_and_pods
from training.pretraining.settings import PretrainSettings

PYTORCHJOB = K8S / "pytorchjob-pretrain.yaml"
PRIMITIVES = {"str": (str,), "int": (int,), "bool": (bool,), "float": (int, float), "object": (object,)}


def objects() -> list[dict]:
    return [doc for doc in yaml.safe_load_all(PYTORCHJOB.read_text()) if doc]


def job() -> dict:
    return only(objects(), "PyTorchJob")


def templates(found: dict) -> dict[str, dict]:
    return {kind.lower(): spec["template"] for kind, spec in found["spec"]["pytorchReplicaSpecs"].items()}


def operator_models():
    return pytest.importorskip("kubeflow.training", reason="kubeflow-training (the training operator's SDK) is not "
                               "installed (scripts/install-deploy-tools.sh installs it)")


def schema_problems(value, type_name: str, path: str) -> list[str]:
    """Where `value` is not a `type_name` of the training operator's API (or of Kubernetes' for the pod
    templates), as the SDKs' generated models describe them: unknown fields and wrong value types."""
    from kubeflow.training import models
    from kubernetes import client

    if type_name.startswith("list["):
        if not isinstance(value, list):
            return [f"{path}: not a list"]
        return [p for i, item in enumerate(value) for p in schema_problems(item, type_name[5:-1], f"{path}[{i}]")]
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            return [f"{path}: not a mapping"]
        inner = type_name.split(",", 1)[1][:-1].strip()
        return [p for key, item in value.items() for p in schema_problems(item, inner, f"{path}.{key}")]
    if type_name in PRIMITIVES:
        wrong = not isinstance(value, PRIMITIVES[type_name]) or (type_name == "int" and isinstance(value, bool))
        return [f"{path}: {value!r} is not {type_name}"] if wrong else []
    model = getattr(models, type_name, None) or getattr(client, type_name)
    if not isinstance(value, dict):
        return [f"{path}: not a {type_name}"]
    fields = {json_name: name for name, json_name in model.attribute_map.items()}
    problems = [f"{path}.{key}: not a field of {type_name}" for key in value if key not in fields]
    return problems + [p for key, item in value.items() if key in fields
                       for p in schema_problems(item, model.openapi_types[fields[key]], f"{path}.{key}")]


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, "latest"])
def test_pytorchjob_validates_against_kubernetes_schemas(version):
    found = objects()
    assert {(o["apiVersion"], o["kind"]) for o in found} == {("kubeflow.org/v1", "PyTorchJob"),
                                                              ("v1", "PersistentVolumeClaim")}
    check_core_objects_and_pods([only(found, "PersistentVolumeClaim")], templates(only(found, "PyTorchJob")),
                                version, "master")


def test_pytorchjob_validates_against_the_training_operators_api():
    operator_models()
    from kubeflow.training.constants import constants

    found = job()
    assert (found["apiVersion"], found["kind"]) == (constants.API_VERSION, constants.PYTORCHJOB_KIND)
    assert schema_problems(found, constants.PYTORCHJOB_MODEL, "PyTorchJob") == []
    replicas = found["spec"]["pytorchReplicaSpecs"]
    assert {kind.lower() for kind in replicas} <= set(constants.PYTORCHJOB_REPLICA_TYPES)
    for spec in replicas.values():
        assert spec["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode")
        names = [c["name"] for c in spec["template"]["spec"]["containers"]]
        assert constants.PYTORCHJOB_CONTAINER in names  # the container the operator gives the rendezvous to
    misspelt, mistyped = copy.deepcopy(found), copy.deepcopy(found)  # the check bites
    misspelt["spec"]["pytorchReplicaSpec"] = misspelt["spec"].pop("pytorchReplicaSpecs")
    mistyped["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "1"
    mistyped["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["port"] = []
    assert schema_problems(misspelt, constants.PYTORCHJOB_MODEL, "PyTorchJob") == [
        "PyTorchJob.spec.pytorchReplicaSpec: not a field of KubeflowOrgV1PyTorchJobSpec"]
    assert len(schema_problems(mistyped, constants.PYTORCHJOB_MODEL, "PyTorchJob")) == 2


def test_pytorchjob_pods_meet_the_restricted_pod_security():
    for name, template in templates(job()).items():
        assert_restricted_pod(name, template["spec"])


def pretrain_settings(argv: list[str]) -> PretrainSettings:
    assert argv[0] == "pretrain"
    return settings_from_args(build_parser().parse_args(argv), PretrainSettings, "pretrain")


def test_pytorchjob_prepares_once_then_launches_torchrun_on_every_node_over_one_shared_volume():
    from torch.distributed.run import get_args_parser

    found = job()
    replicas = found["spec"]["pytorchReplicaSpecs"]
    nodes = sum(spec["replicas"] for spec in replicas.values())
    claim = only(objects(), "PersistentVolumeClaim")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]  # one volume mounted by pods on several nodes
    prepare_steps = [c for c in replicas["Master"]["template"]["spec"]["initContainers"] if c["command"] == ["berth"]]
    assert len(prepare_steps) == 1  # prepared once, before rank 0's launcher starts
    prepare = pretrain_settings(prepare_steps[0]["args"])
    assert prepare_steps[0]["command"] == ["berth"] and prepare.prepare_only and prepare.workers > 1
    assert float(prepare_steps[0]["resources"]["limits"]["cpu"]) >= prepare.workers

    for kind, spec in replicas.items():
        pod = spec["template"]["spec"]
        (container,) = [c for c in pod["containers"] if c["name"] == "pytorch"]
        assert container["command"] == ["torchrun"]
        launch = get_args_parser().parse_args(container["args"])  # torchrun's own parser
        assert launch.nnodes == str(nodes) and launch.nproc_per_node == found["spec"]["nprocPerNode"]
        assert launch.rdzv_backend == "c10d" and launch.rdzv_endpoint == "$(MASTER_ADDR):$(MASTER_PORT)"
        assert launch.module and launch.training_script == "berth.cli"
        train = pretrain_settings(launch.training_script_args)
        assert not train.prepare_only and train.dist_timeout_minutes > 0
        # the training names the folder the preparation wrote, prepared with the same data settings
        assert train.corpus == [prepare.out / "data"] and train.out == prepare.out and train.base == prepare.base
        nsp = False  # the embedded base has no trained NSP head
        assert train.data_settings(nsp) == prepare.data_settings(nsp)
        assert float(container["resources"]["limits"]["cpu"]) >= train.num_threads * int(launch.nproc_per_node)
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v}
        for path, user in [(p, container) for p in (train.corpus[0], train.out, *prepare.corpus)] + [
                (prepare.out / "data" / "manifest.json", waiter) for waiter in pod.get("initContainers", [])]:
            mounts = {m["mountPath"]: m["name"] for m in user["volumeMounts"]}
            mount = next(p for p in mounts if str(path).startswith(p + "/"))
            assert claims[mounts[mount]] == claim["metadata"]["name"], (kind, path)
        if kind != "Master":  # the other nodes start their launchers once the data is prepared
            (waiter,) = pod["initContainers"]
            assert f"until [ -f {prepare.out / 'data' / 'manifest.json'} ]" in " ".join(waiter["command"])
