"""`berth predict --ray` on a real Ray cluster (nodes started on 127.0.0.1 by the test) writes the file a
local run of the same job writes: same rows, ids, row numbers, fields and bad rows, in input order."""

from __future__ import annotations

import json

import pytest

from tasks.readers import read_conll
from tests.predict.conftest import read_output, run_predict, write_jsonl
from tests.predict.ray_cluster import RayCluster

pytest.importorskip("ray", reason="berth predict --ray needs ray (pip install 'berth[ray]')")


@pytest.fixture(scope="module")
def two_nodes():
    cluster = RayCluster(nodes=2, cpus_per_node=1)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def one_node():
    cluster = RayCluster(nodes=1, cpus_per_node=1)
    try:
        yield cluster
    finally:
        cluster.stop()


def sst2_rows(shared_data, count: int) -> list[dict]:
    with open(shared_data / "sst2" / "train.tsv", encoding="utf-8") as f:
        lines = f.read().splitlines()[1 : count + 1]
    return [{"id": f"s{i}", "text": line.split("\t")[0]} for i, line in enumerate(lines)]


def run_both(bundle, source, tmp_path, address: str, *options: str) -> tuple[list, list, dict]:
    """The same job locally and on Ray (one ONNX Runtime thread each): both outputs and the Ray summary."""
    local, on_ray = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    run_predict(str(bundle), str(source), "--out", str(local), *options, "--no-progress", threads=1)
    _, summary, _ = run_predict(
        str(bundle), str(source), "--out", str(on_ray), *options, "--no-progress", "--ray", address, threads=1
    )
    for out in (local, on_ray):
        assert not out.with_name(out.name + ".parts").exists()
    return read_output(local), read_output(on_ray), summary


def errors_of(out) -> list[dict]:
    return [json.loads(line) for line in out.with_name(out.name + ".errors.jsonl").read_text().splitlines()]


def check_classification(
    shared_data, bundle_repository, cluster: RayCluster, tmp_path, count: int, nodes: int
) -> None:
    rows = sst2_rows(shared_data, count)
    rows[7] = {"id": "no-text", "title": "a row without its text column"}
    rows[count // 2]["text"] = "   "
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    local, on_ray, summary = run_both(
        bundle_repository / "sentiment", source, tmp_path, cluster.address, "--window", "32"
    )
    assert (summary["rows"], summary["written"], summary["errors"]) == (count, count - 2, 2)
    assert summary["nodes_used"] == nodes
    assert [r["id"] for r in on_ray] == [
        r["id"] for r in rows if r["id"] not in ("no-text", f"s{count // 2}")
    ]
    assert [(r["id"], r["row"], r["label"], r["truncated"], r["truncated_tokens"]) for r in on_ray] == [
        (r["id"], r["row"], r["label"], r["truncated"], r["truncated_tokens"]) for r in local
    ]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(on_ray, local)) < 1e-6
    assert errors_of(tmp_path / "ray.parquet") == errors_of(tmp_path / "local.parquet")
    assert [e["id"] for e in errors_of(tmp_path / "ray.parquet")] == ["no-text", f"s{count // 2}"]


@pytest.mark.slow  # about 60 s on two shared cores (cluster start included): ray stays out of the test extra
def test_classification_on_one_node_equals_the_local_run(shared_data, bundle_repository, one_node, tmp_path):
    check_classification(shared_data, bundle_repository, one_node, tmp_path, 100, nodes=1)


@pytest.mark.slow
def test_classification_on_two_nodes_equals_the_local_run(
    shared_data, bundle_repository, two_nodes, tmp_path
):
    check_classification(shared_data, bundle_repository, two_nodes, tmp_path, 300, nodes=2)


@pytest.mark.slow
def test_ner_on_two_nodes_equals_the_local_run(shared_data, bundle_repository, two_nodes, tmp_path):
    sentences = [
        " ".join(e.tokens) for e in read_conll(shared_data / "conll2003" / "iob2" / "valid.txt")[:200]
    ]
    source = tmp_path / "in.tsv"
    source.write_text("text\n" + "\n".join(s.replace("\t", " ") for s in sentences) + "\n", encoding="utf-8")
    local, on_ray, summary = run_both(
        bundle_repository / "entities", source, tmp_path, two_nodes.address, "--window", "50"
    )
    assert summary["rows"] == summary["written"] == len(local) == 200
    assert [r["row"] for r in on_ray] == list(range(200)) == [r["id"] for r in on_ray]
    for a, b in zip(on_ray, local):
        assert [(e["entity"], e["text"], e["start"], e["end"]) for e in a["entities"]] == [
            (e["entity"], e["text"], e["start"], e["end"]) for e in b["entities"]
        ]
        assert all(abs(x["score"] - y["score"]) < 1e-6 for x, y in zip(a["entities"], b["entities"]))
