"""With the default int8 recipe (one activation scale per token row), `berth predict` over a file answers every row
as the HTTP service answers it asked alone: the same labels and entity spans, scores within 1e-4. Before, an int8
item's scores moved with its batch neighbours, and a file and the API disagreed on labels."""

from __future__ import annotations

import httpx
import pytest

from export.bundle_builder import export_bundle
from export.settings import ExportSettings
from tasks.readers import read_conll
from tests.predict.conftest import read_output, run_predict, write_jsonl
from tests.predict.test_matches_service import assert_same, sst2
from tests.service.conftest import ServerProcess


@pytest.fixture(scope="module")
def int8_server(checkpoints, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("int8-repository")
    for name in ("sentiment", "entities"):
        # The test heads are barely trained: agreement with PyTorch is not what this test is about.
        export_bundle(ExportSettings(model_folder=checkpoints[name], out=root / "repository" / name, precision="int8",
                                     optimize="never", parity_examples=16, min_agreement=0.5, threads=2))
    proc = ServerProcess(root / "repository", root / "serve.log")
    proc.repository = root / "repository"
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def alone(server, route: str, model: str, inputs: list[str]) -> list:
    """Each input in a request of its own, one at a time: nothing else is in its forward pass."""
    answers = []
    with httpx.Client(base_url=server.url, timeout=120) as http:
        for text in inputs:
            response = http.post(route, json={"model": model, "inputs": [text]})
            assert response.status_code == 200, response.text
            answers += response.json()["results"]
    return answers


def test_a_1000_row_file_gets_the_labels_and_scores_the_api_gives_each_row_alone(shared_data, int8_server, tmp_path):
    texts = sst2(shared_data, 1000, "train")
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts)])
    out = tmp_path / "out.jsonl"
    run_predict(str(int8_server.repository / "sentiment"), str(source), "--out", str(out))
    rows = read_output(out)
    expected = alone(int8_server, "/v1/classify", "sentiment", texts)
    assert [r["id"] for r in rows] == list(range(1000))
    assert [r["label"] for r in rows] == [e["label"] for e in expected]  # 100% of the labels
    for i, (row, answer) in enumerate(zip(rows, expected)):
        assert_same(row["score"], answer["score"], f"row {i}")


def test_entity_spans_of_a_file_are_the_api_spans_of_each_row_alone(shared_data, int8_server, tmp_path):
    sentences = [" ".join(e.tokens) for e in read_conll(shared_data / "conll2003" / "iob2" / "valid.txt")]
    texts = [s for s in sentences if "DOCSTART" not in s][:200]
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": f"s{i}", "text": t} for i, t in enumerate(texts)])
    out = tmp_path / "out.jsonl"
    run_predict(str(int8_server.repository / "entities"), str(source), "--out", str(out))
    rows = read_output(out)
    expected = alone(int8_server, "/v1/ner", "entities", texts)
    for i, (row, answer) in enumerate(zip(rows, expected)):
        spans = [(e["start"], e["end"], e["entity"]) for e in row["entities"]]
        assert spans == [(e["start"], e["end"], e["entity"]) for e in answer], f"row {i}"
        assert_same([e["score"] for e in row["entities"]], [e["score"] for e in answer], f"row {i}")


def test_the_models_listing_shows_each_bundles_batch_invariance(int8_server):
    listing = httpx.get(int8_server.url + "/v1/models", timeout=30).json()
    models = {m["name"]: m for m in (listing["models"] if isinstance(listing, dict) else listing)}
    for name in ("sentiment", "entities"):
        figures = models[name]["batch_invariance"]
        assert figures["batch_dependent"] is False and figures["max_abs_diff"] <= 1e-3, figures
        assert figures["batch_sizes"] == [8, 32] and figures["examples"] == 16
