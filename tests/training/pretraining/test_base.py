"""Continued pretraining from a released checkpoint (`berth pretrain --base`), on the embedded all-MiniLM-L6-v2:
a folder without a masked-LM head (its new head warms up alone, the encoder untouched) and one with it (nothing
new, no warm-up); what a base fixes is refused in one line; the output loads in transformers and fine-tunes."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from berth.cli import main
from training.bert.checkpoint import default_base_path, load_pretrained, read_state_dict, save_pretrained
from training.bert.model import BertForPreTraining
from training.loop.training_state import latest_training_state, load_training_state

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "data" / "samples"
SMALL = ["--max-seq-length", "32", "--batch-size", "8", "--threads", "1", "--precision", "fp32", "--log-every", "1",
         "--heldout-fraction", "0.2"]


def _berth(*args: str) -> tuple[int, str]:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # a setting refused before the command runs
            code = exit_.code
    return code, printed.getvalue()


@pytest.fixture(scope="module")
def corpus(shared_data) -> list[str]:
    return [str(f) for f in sorted((shared_data / "pretraining" / "inaugural").glob("*.txt"))[:8]]


@pytest.fixture(scope="module")
def continued(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dapt") / "out"
    code, printed = _berth("pretrain", *corpus, "--out", str(out), "--base", "default", "--max-steps", "4",
                           "--head-warmup-steps", "2", *SMALL)
    assert code == 0, printed
    return out


def _encoder(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The encoder's weights, named as in a BertModel folder."""
    return {k.removeprefix("bert."): v for k, v in state.items()
            if k.removeprefix("bert.").startswith(("embeddings.", "encoder."))
            and not k.endswith("position_ids")}


def test_a_base_without_an_mlm_head_gets_a_new_one_trained_alone_first(continued):
    base = _encoder(read_state_dict(default_base_path()))
    record = json.loads((continued / "pretrain_run.json").read_text())
    assert record["model_class"] == "BertForMaskedLM" and record["nsp"] is False  # the base has no NSP head
    assert sorted(record["new_heads"]) == sorted([
        "cls.predictions.bias", "cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias"])
    assert record["head_warmup"]["steps"] == 2 and record["learning_rate"] == 5e-5
    assert record["base"]["path"] == str(default_base_path())
    weights = (default_base_path() / "model.safetensors").read_bytes()
    assert record["base"]["sha256"] == hashlib.sha256(weights).hexdigest()

    warm = load_training_state(latest_training_state(continued / "head_warmup"))["model"]
    assert warm["cls.predictions.transform.dense.weight"].abs().sum() > 0
    for name, tensor in _encoder(warm).items():  # the warm-up left every encoder weight as the base had it
        assert torch.equal(tensor, base[name]), name
    final = _encoder(read_state_dict(continued))
    assert any(not torch.equal(final[n], base[n]) for n in base)  # then the encoder trained


def test_the_same_command_ends_with_the_same_weights(corpus, continued, tmp_path):
    # the heads the base lacks start from the seed's weights, so a run is reproducible as a run from scratch is
    again = tmp_path / "again"
    code, printed = _berth("pretrain", *corpus, "--out", str(again), "--base", "default", "--max-steps", "4",
                           "--head-warmup-steps", "2", *SMALL)
    assert code == 0, printed
    first, second = read_state_dict(continued), read_state_dict(again)
    assert first.keys() == second.keys()
    for name, tensor in first.items():
        assert torch.equal(tensor, second[name]), name


def test_the_output_loads_in_transformers_and_fine_tunes(continued, tmp_path):
    transformers = pytest.importorskip("transformers")
    model, info = transformers.BertForMaskedLM.from_pretrained(continued, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    tokenizer = transformers.AutoTokenizer.from_pretrained(continued)
    assert tokenizer.vocab_size == 30522  # the base's own vocabulary
    code, printed = _berth("finetune", "--task", "classification", "--base", str(continued),
                           "--train", str(SAMPLES / "topics/train.jsonl"), "--dev", str(SAMPLES / "topics/dev.jsonl"),
                           "--out", str(tmp_path / "ft"), "--max-train-examples", "16", "--max-eval-examples", "8",
                           "--max-seq-length", "32", "--epochs", "1", "--batch-size", "8", "--threads", "1")
    assert code == 0, printed


def test_a_base_with_its_heads_continues_without_a_warmup(corpus, tmp_path):
    with_heads = tmp_path / "with-heads"
    model, _ = load_pretrained(BertForPreTraining, default_base_path())  # heads fresh: now saved as the base's own
    save_pretrained(model, with_heads, tokenizer_from=default_base_path())
    code, printed = _berth("pretrain", *corpus, "--out", str(tmp_path / "out"), "--base", str(with_heads),
                           "--max-steps", "2", *SMALL)
    assert code == 0, printed
    record = json.loads((tmp_path / "out" / "pretrain_run.json").read_text())
    assert record["new_heads"] == [] and record["head_warmup"] is None
    assert record["nsp"] is True and record["model_class"] == "BertForPreTraining"  # its NSP head is kept training


@pytest.mark.parametrize("flags, says", [
    (["--preset", "mini"], "--preset cannot be used with --base"),
    (["--vocab-size", "1000", "--layers", "2"], "--vocab-size, --layers cannot be used with --base"),
    (["--max-seq-length", "1024"], "sequence length 1024 is past the base's 512 positions"),
    (["--group-by-length"], "--group-by-length does not apply to pretraining"),
])
def test_what_a_base_fixes_is_refused_in_one_line(corpus, tmp_path, flags, says):
    code, printed = _berth("pretrain", corpus[0], "--out", str(tmp_path / "out"), "--base", "default", *flags)
    assert code == 2 and says in printed and "Traceback" not in printed


def test_a_folder_that_is_not_a_checkpoint_is_refused_without_a_traceback(corpus, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("not a model")
    done = subprocess.run([sys.executable, "-m", "berth.cli", "pretrain", corpus[0], "--out", str(tmp_path / "out"),
                           "--base", str(tmp_path / "notes")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (f"berth pretrain: --base {tmp_path / 'notes'}: no config.json, so "
                                                    "not a Hugging Face BERT checkpoint folder")
    assert "Traceback" not in done.stderr
