"""`berth build-defaults` exports the embedded base as the `embeddings` bundle (no training), once."""

from __future__ import annotations

import pytest

from berth.build_defaults import default_examples
from berth.cli import main
from tasks.bundle_checks import load_bundle


@pytest.mark.slow
def test_build_defaults_only_embeddings_exports_the_base_once(tmp_path, capsys):
    out = tmp_path / "models"
    assert main(["build-defaults", "--only", "embeddings", "--out", str(out), "--work", str(tmp_path / "work"),
                 "--threads", "2"]) == 0
    bundle = load_bundle(out / "embeddings")
    assert bundle.task == "embedding" and bundle.precision == "fp32" and bundle.parity["passed"]
    assert bundle.task_settings["pooling"] == "mean" and bundle.task_settings["normalize"] is True
    assert bundle.task_settings["max_seq_length"] == 256
    assert [o.name for o in bundle.outputs] == ["sentence_embedding", "hidden_states"]
    assert bundle.examples == default_examples()["embeddings"]  # the playground's examples
    assert not (tmp_path / "work").exists()  # nothing was fine-tuned
    capsys.readouterr()
    main(["build-defaults", "--only", "embeddings", "--out", str(out), "--work", str(tmp_path / "work")])
    assert "bundle exists, skipped" in capsys.readouterr().err
