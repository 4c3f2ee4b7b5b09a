"""The default models answer the hand-written demo items (data/demo/demo_items.json), and a model
under its quality floor is served marked as such.

The demo items were written by hand for this check, with gold answers, gold entity spans
(character offsets) and gold pair orderings; they are never trained on (checked below against
the shipped samples). The slow test serves the bundles `make run` builds (`models/`, or
$BERTH_DEMO_MODELS) and needs them built first: `make bundles`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import ServerProcess

REPO = Path(__file__).resolve().parents[2]
ITEMS = json.loads((REPO / "data" / "demo" / "demo_items.json").read_text(encoding="utf-8"))
DEFAULTS = ("squad", "entities", "similarity", "topics")


def _texts() -> list[str]:
    return ([q["context"] for q in ITEMS["qa"]] + [q["question"] for q in ITEMS["qa"]]
            + [s["text"] for s in ITEMS["ner"]] + [t for p in ITEMS["pairs"] for t in p.values()])


def test_demo_items_are_hand_written_gold_and_not_in_the_training_samples():
    assert len(ITEMS["qa"]) >= 20 and len(ITEMS["ner"]) == 10 and len(ITEMS["pairs"]) == 5
    for item in ITEMS["qa"]:
        assert all(answer in item["context"] for answer in item["answers"])
    for sentence in ITEMS["ner"]:
        for entity in sentence["entities"]:
            assert sentence["text"][entity["start"]:entity["end"]] == entity["text"]
            assert entity["label"] in ("PER", "LOC", "ORG")
    samples = "\n".join(path.read_text(encoding="utf-8") for path in sorted((REPO / "data" / "samples").rglob("*"))
                        if path.is_file() and path.name not in ("SOURCES.md", "examples.json"))  # examples: not trained on
    assert [text for text in _texts() if text in samples] == []
    # The CoNLL samples hold one token per line: compare the NER sentences as token sequences too.
    conll_lines = [line.split("\t")[0] for path in (REPO / "data" / "samples" / "entities").glob("*.conll")
                   for line in path.read_text(encoding="utf-8").splitlines()]
    joined = " ".join(conll_lines)
    assert [s["text"] for s in ITEMS["ner"] if s["text"].rstrip(".").replace(",", " ,") in joined] == []


def test_a_bundle_under_its_quality_floor_is_listed_and_logged(bundle_repository, tmp_path):
    from berth.build_defaults import _record_quality

    repository = tmp_path / "repository"
    for name in ("sentiment", "reader"):
        shutil.copytree(bundle_repository / name, repository / name)
    _record_quality(repository / "sentiment", {"metric": "accuracy", "floor": 0.6, "value": 0.41,
                                               "below_floor": True, "rounds": 2})
    _record_quality(repository / "reader", {"metric": "f1", "floor": 50.0, "value": 71.0,
                                            "below_floor": False, "rounds": 1})
    server = ServerProcess(repository, tmp_path / "serve.log").wait_ready()
    try:
        listing = httpx.get(server.url + "/v1/models", timeout=30).json()["models"]
    finally:
        server.stop()
    flags = {m["name"]: m["below_quality_floor"] for m in listing}
    assert flags == {"sentiment": True, "reader": False}
    log = server.log()
    assert "MODEL sentiment IS BELOW ITS QUALITY FLOOR" in log and "MODEL reader" not in log


@pytest.mark.slow
def test_the_default_models_answer_the_demo_items(tmp_path):
    from scripts.demo_check import TARGETS, check

    models = Path(os.environ.get("BERTH_DEMO_MODELS", REPO / "models"))
    missing = [name for name in DEFAULTS if not (models / name / "bundle.json").is_file()]
    if missing:
        pytest.skip(f"the default bundles {missing} are not built in {models}: run `make bundles` first")
    server = ServerProcess(models, tmp_path / "serve.log",
                           env={"BERTH_MAX_BATCH_TOKENS": "8192", "BERTH_LENGTH_BUCKETS": "32,64,128,256"})
    try:
        result = check(server.wait_ready().url, ITEMS)
    finally:
        server.stop()
    misses = {"qa": [r for r in result["qa"] if not r["exact"]], "ner": [r for r in result["ner"] if not r["found"]],
              "pairs": [r for r in result["pairs"] if not r["ordered"]]}
    assert all(result["figures"][k] >= TARGETS[k] for k in TARGETS), (result["figures"], misses)
