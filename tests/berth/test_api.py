"""The Python API's package side (berth/__init__.py, berth/api.py): `import berth` stays light, the package is
typed, and berth.finetune -> berth.export -> berth.load works from a tiny real BERT folder. Its answers against the
HTTP routes, for every task, are tests/service/test_python_api.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_import_berth_loads_neither_torch_nor_onnxruntime():
    code = "import sys, berth; print('torch' in sys.modules, 'onnxruntime' in sys.modules, callable(berth.load))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "True"]


def test_py_typed_ships_with_the_package():
    assert (REPO / "berth" / "py.typed").is_file()
    assert Path(__import__("berth").__file__).parent.joinpath("py.typed").is_file()


def test_finetune_export_load_against_transformers(tmp_path):
    """berth.finetune -> berth.export -> berth.load, from a tiny real BERT folder on the shipped topics sample; the
    loaded bundle answers as transformers' text-classification pipeline on the fine-tuned folder."""
    import torch
    from transformers import pipeline

    import berth
    from training.bert.checkpoint import default_base_path, save_pretrained
    from training.bert.model import BertConfig, BertModel

    samples = REPO / "data" / "samples" / "topics"
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    save_pretrained(BertModel(config), tmp_path / "base", tokenizer_from=default_base_path())
    metrics = berth.finetune(task="classification", train_file=samples / "train.jsonl", dev_file=samples / "dev.jsonl",
                             out=tmp_path / "run", base=str(tmp_path / "base"), max_train_examples=120,
                             max_eval_examples=20, max_seq_length=32, batch_size=4, epochs=1, learning_rate=1e-3,
                             precision="fp32", num_threads=1)
    assert 0 <= metrics["accuracy"] <= 1 and (tmp_path / "run" / "config.json").is_file()
    bundle = berth.export(tmp_path / "run", tmp_path / "bundle", precision="fp32", optimize="never",
                          parity_examples=8, threads=1, device="cpu")
    assert bundle.task == "classification" and bundle.parity["passed"]
    with pytest.raises(FileExistsError, match="force=True"):
        berth.export(tmp_path / "run", tmp_path / "bundle")
    texts = ["Who painted the Mona Lisa?", "What is the capital of Kenya?", "How do vaccines work?"]
    got = berth.load(tmp_path / "bundle", threads=1)(texts)
    torch.set_num_threads(1)
    reference = pipeline("text-classification", model=str(tmp_path / "run"), device="cpu")
    expected = reference(texts, truncation=True, max_length=32)
    assert [r["label"] for r in got] == [r["label"] for r in expected]
    assert [r["score"] for r in got] == pytest.approx([r["score"] for r in expected], abs=1e-4)


def test_finetune_and_export_refuse_bad_settings_before_any_work(tmp_path):
    from pydantic import ValidationError

    import berth

    with pytest.raises(ValidationError, match="task"):
        berth.finetune(task="translation", train_file=tmp_path / "x.jsonl", out=tmp_path / "out")
    with pytest.raises(ValidationError, match="precision"):
        berth.export(tmp_path, tmp_path / "bundle", precision="fp8")
    assert not (tmp_path / "out").exists() and not (tmp_path / "bundle").exists()
