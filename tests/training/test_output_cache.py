"""The dev outputs kept beside a finetune folder's weights answer a later run exactly, and only when the weights,
inputs and outputs asked for are the same: the real all-MiniLM-L6-v2 encoder with a seeded classification head
on real SST-2 dev sentences; the expected rows are the model's own, run afresh."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from export import parity  # noqa: E402
from export.calibration import adapter  # noqa: E402
from tasks.runtime.spec import TaskSpec  # noqa: E402
from training.bert.checkpoint import load_pretrained, save_pretrained  # noqa: E402
from training.bert.model import BertForSequenceClassification, BertForTokenClassification  # noqa: E402
from training.bert.torch_runner import torch_item_runner  # noqa: E402
from training.finetuning.output_cache import Recorder, Reusing  # noqa: E402

SST2 = (parity.default_data_dir() or Path("/nonexistent")) / "sst2"
pytestmark = pytest.mark.skipif(not (SST2 / "dev.tsv").is_file(), reason="needs ../shared/data/sst2")
SPEC = TaskSpec(task="classification", labels=["0", "1"], max_seq_length=64)


class Counting:
    """A real runner that counts the calls that reached the model."""

    def __init__(self, model):
        self.run, self.calls = torch_item_runner(model), 0

    def __call__(self, items, names, per_token):
        self.calls += 1
        return self.run(items, names, per_token)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, base_path, tokenizer):
    """A seeded head saved to a folder with its recorded outputs on 24 dev sentences, and those items."""
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model, _ = load_pretrained(BertForSequenceClassification, base_path, id2label={0: "0", 1: "1"})
    model.eval()
    task = adapter(SPEC, tokenizer, SST2 / "dev.tsv")
    examples = task.read(SST2 / "dev.tsv", limit=24, seed=None)
    recorder = Recorder(torch_item_runner(model))
    metrics, _ = task.evaluate(recorder, examples, SPEC)
    folder = save_pretrained(model, tmp_path_factory.mktemp("cache") / "cls", tokenizer_from=base_path)
    path = recorder.save(folder / "dev_outputs.npz", model)
    items = recorder.calls[0][0]
    return folder, path, items, metrics, task, examples


def _reloaded(folder: Path):
    model, _ = load_pretrained(BertForSequenceClassification, folder)
    return model.eval()


def test_the_same_weights_on_the_same_inputs_are_answered_from_the_file_exactly(saved):
    folder, path, items, metrics, task, examples = saved
    model = _reloaded(folder)  # the weights as export loads them, not the object that was recorded
    fresh = torch_item_runner(model)(items, ["logits"], False)
    counting = Counting(model)
    reusing = Reusing(counting, model, path)
    rows = reusing(items, ["logits"], False)
    assert counting.calls == 0 and reusing.reused == 1
    assert len(rows) == len(fresh) == 24
    for got, want in zip(rows, fresh):
        assert got["logits"].dtype == want["logits"].dtype and np.array_equal(got["logits"], want["logits"])
    # And the task's metric from them is the one the recorded evaluation gave.
    assert task.evaluate(Reusing(counting, model, path), examples, SPEC)[0] == metrics
    assert counting.calls == 0


def test_other_weights_other_inputs_or_other_outputs_run_the_model(saved):
    folder, path, items, _, _, _ = saved
    changed = _reloaded(folder)
    with torch.no_grad():
        changed.classifier.bias += 1e-3  # one number of the weights
    counting = Counting(changed)
    rows = Reusing(counting, changed, path)(items, ["logits"], False)
    assert counting.calls == 1
    fresh = torch_item_runner(changed)(items, ["logits"], False)
    assert all(np.array_equal(a["logits"], b["logits"]) for a, b in zip(rows, fresh))

    model = _reloaded(folder)
    counting = Counting(model)
    reusing = Reusing(counting, model, path)
    reusing(items[:23], ["logits"], False)  # one input fewer
    assert counting.calls == 1 and reusing.reused == 0
    edited = copy.copy(items[0])
    edited.input_ids = [*items[0].input_ids[:1], items[0].input_ids[1] + 1, *items[0].input_ids[2:]]
    reusing([edited, *items[1:]], ["logits"], False)  # one token changed
    assert counting.calls == 2 and reusing.reused == 0
    reusing(items, ["logits"], True)  # the same output, trimmed otherwise
    assert counting.calls == 3 and reusing.reused == 0


def test_another_head_on_the_same_encoder_is_not_answered_from_the_file(saved, base_path):
    """Same encoder weights, another head class and configuration: a key miss, never another model's rows."""
    folder, path, items, _, _, _ = saved
    torch.manual_seed(0)
    token_head, _ = load_pretrained(BertForTokenClassification, base_path, id2label={0: "0", 1: "1"})
    counting = Counting(token_head.eval())
    Reusing(counting, token_head, path)(items, ["logits"], True)
    assert counting.calls == 1


def test_without_a_file_the_model_runs(saved, tmp_path):
    folder, _, items, _, _, _ = saved
    model = _reloaded(folder)
    counting = Counting(model)
    reusing = Reusing(counting, model, tmp_path / "absent.npz")
    reusing(items, ["logits"], False)
    assert counting.calls == 1 and reusing.reused == 0


@pytest.mark.parametrize("content", [b"", b"not a zip file", b"PK\x03\x04 cut short"])
def test_a_damaged_file_is_not_trusted_and_the_model_runs(saved, tmp_path, content):
    folder, _, items, _, _, _ = saved
    damaged = tmp_path / "dev_outputs.npz"
    damaged.write_bytes(content)
    model = _reloaded(folder)
    counting = Counting(model)
    reusing = Reusing(counting, model, damaged)
    rows = reusing(items, ["logits"], False)
    assert counting.calls == 1 and reusing.reused == 0 and len(rows) == 24


def test_a_file_of_another_kind_is_not_trusted(saved, tmp_path):
    folder, _, items, _, _, _ = saved
    foreign = tmp_path / "dev_outputs.npz"
    with open(foreign, "wb") as file:
        np.savez(file, other=np.zeros(3))  # a valid .npz without the keys
    model = _reloaded(folder)
    counting = Counting(model)
    Reusing(counting, model, foreign)(items, ["logits"], False)
    assert counting.calls == 1


def test_outputs_over_the_size_limit_are_not_kept(saved, tmp_path, monkeypatch):
    from training.finetuning import output_cache

    folder, _, items, _, _, _ = saved
    model = _reloaded(folder)
    recorder = Recorder(torch_item_runner(model))
    recorder(items, ["logits"], False)
    monkeypatch.setattr(output_cache, "MAX_BYTES", 24 * 2 * 4 - 1)  # one byte under 24 rows of 2 float32 logits
    assert recorder.save(tmp_path / "big.npz", model) is None and not (tmp_path / "big.npz").exists()
    monkeypatch.setattr(output_cache, "MAX_BYTES", 24 * 2 * 4)
    assert recorder.save(tmp_path / "big.npz", model) == tmp_path / "big.npz"


def test_the_digest_reads_every_tensor_a_scalar_and_an_empty_one_included():
    """A 0-dim buffer (a temperature, a step count) and an empty one are part of what decides the outputs."""
    from training.finetuning.output_cache import model_digest

    def module(scale: float) -> torch.nn.Module:
        torch.manual_seed(0)
        layer = torch.nn.Linear(3, 2)
        layer.register_buffer("scale", torch.tensor(scale))
        layer.register_buffer("nothing", torch.zeros(0))
        return layer

    assert model_digest(module(1.0)) == model_digest(module(1.0))
    assert model_digest(module(1.0)) != model_digest(module(2.0))
