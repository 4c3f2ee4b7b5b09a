"""The rerank guard of `berth build-defaults`: a reranker whose dev MRR@10 is not above the embeddings model's on
the same candidates is not shipped; the recipe's fallbacks train in turn, and the build record says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from berth.build_defaults import RECORD_FILE, build_defaults, load_recipes
from berth.config_files import ConfigError

SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples"
RECIPE = """recipes:
- name: rerank
  task: rerank
  train: rerank/train.json
  dev: rerank/dev.json
  options: {max_steps: 1, max_train_examples: 16, batch_size: 4, negatives: 3, max_seq_length: 64}
  beat_embeddings: true
  fallbacks:
  - {train: squad/train.json, options: {learning_rate: 1.0e-5}}
"""


def test_a_fallback_must_override_recipe_fields_and_settings_only(tmp_path):
    path = tmp_path / "recipes.yaml"
    path.write_text(RECIPE.replace("{train: squad/train.json,", "{trian: squad/train.json,"), encoding="utf-8")
    with pytest.raises(ConfigError, match="a fallback overrides no recipe field trian"):
        load_recipes(path)
    path.write_text(RECIPE.replace("learning_rate: 1.0e-5", "lr: 1.0e-5"), encoding="utf-8")
    with pytest.raises(ConfigError, match="fallbacks options names no setting lr"):
        load_recipes(path)
    path.write_text(RECIPE, encoding="utf-8")
    assert load_recipes(path)[0].fallbacks == ({"train": "squad/train.json", "options": {"learning_rate": 1e-5}},)


@pytest.mark.slow
def test_a_reranker_that_does_not_beat_the_embeddings_model_is_not_shipped(tmp_path, base_path, capsys):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model = sentence_transformers.SentenceTransformer(str(base_path), device="cpu")
    # Dev: 4 shipped dev questions whose own paragraph the embeddings model (sentence-transformers, the same
    # checkpoint) ranks first: its MRR@10 there is 1.0, which no reranker can be above.
    dev = json.loads((SAMPLES / "rerank" / "dev.json").read_text(encoding="utf-8"))
    kept = 0
    for article in dev["data"]:
        contexts = [p["context"] for p in article["paragraphs"]]
        for number, paragraph in enumerate(article["paragraphs"]):
            easy = []
            for qa in paragraph["qas"]:
                if kept + len(easy) == 4:
                    break
                vectors = model.encode([qa["question"], *(contexts[i] for i in qa["candidates"])],
                                       normalize_embeddings=True)
                if qa["candidates"][int((vectors[1:] @ vectors[0]).argmax())] == number:
                    easy.append(qa)
            paragraph["qas"] = easy
            kept += len(easy)
    assert kept == 4
    data = tmp_path / "data"
    (data / "rerank").mkdir(parents=True)
    (data / "rerank" / "dev.json").write_text(json.dumps(dev), encoding="utf-8")
    (data / "rerank" / "train.json").symlink_to(SAMPLES / "rerank" / "train.json")
    (data / "squad").symlink_to(SAMPLES / "squad")
    recipes = tmp_path / "recipes.yaml"
    recipes.write_text(RECIPE, encoding="utf-8")
    out, work = tmp_path / "models", tmp_path / "work"
    (out / "rerank").mkdir(parents=True)
    (out / "rerank" / "bundle.json").write_text("{}", encoding="utf-8")  # an earlier build's: not left to serve

    assert build_defaults(out, work, data_dir=data, force=True, precision="fp32", threads=2,
                          recipes_file=recipes) == []
    assert not (out / "rerank").exists()
    record = json.loads((work / RECORD_FILE).read_text(encoding="utf-8"))["models"][0]
    assert record["name"] == "rerank" and record["shipped"] is False
    guard = record["quality"]["guard"]
    assert [t["recipe"] for t in guard["tries"]] == ["main", {"train": "squad/train.json",
                                                              "options": {"learning_rate": 1e-5}}]
    for attempt in guard["tries"]:
        assert attempt["embeddings"] == 1.0 and attempt["queries"] == 4 and attempt["passed"] is False
        assert 0 < attempt["reranker"] <= 1.0
    # the next build (make run again) does not train it again for nothing; --force would
    assert json.loads((work / "rerank-not-shipped.json").read_text(encoding="utf-8"))["passed"] is False
    capsys.readouterr()
    assert build_defaults(out, work, data_dir=data, precision="fp32", threads=2, recipes_file=recipes) == []
    assert "rerank: not shipped by an earlier build" in capsys.readouterr().err
