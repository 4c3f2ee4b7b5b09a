"""int8 recipes (static QDQ calibrated on training data, sensitive MatMuls kept in fp32) and the gate's
two measures: the task metric on gold dev answers, and agreement where the reference is confident.

The model is the real all-MiniLM-L6-v2 encoder with a seeded classification head; the data is real
SST-2 (train for calibration, dev for the metric) from ../shared/data. Expectations are computed
here from the gold labels and the PyTorch model, not by the gate's code.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from export import calibration, parity, precision  # noqa: E402
from export.onnx_export import export_onnx, load_finetuned  # noqa: E402
from tasks import readers  # noqa: E402
from tasks.common import encode_classification  # noqa: E402
from tasks.runtime.onnx_session import create_session, onnx_item_runner  # noqa: E402
from tasks.runtime.spec import TaskSpec  # noqa: E402
from training.bert.checkpoint import load_pretrained, save_pretrained  # noqa: E402
from training.bert.model import BertForSequenceClassification  # noqa: E402
from training.bert.torch_runner import torch_item_runner, torch_runner  # noqa: E402

SST2 = (parity.default_data_dir() or Path("/nonexistent")) / "sst2"
pytestmark = pytest.mark.skipif(not (SST2 / "dev.tsv").is_file(), reason="needs ../shared/data/sst2")
SPEC = TaskSpec(task="classification", labels=["0", "1"], max_seq_length=64)
DEV_EXAMPLES = 48


def _folder(root: Path, base_path: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    model, _ = load_pretrained(BertForSequenceClassification, base_path, id2label={0: "0", 1: "1"})
    folder = save_pretrained(model, root / f"cls-{seed}", tokenizer_from=base_path)
    SPEC.save(folder)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory, base_path):
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("int8")
    loaded = {}
    for seed in (0, 1):
        model, spec, _ = load_finetuned(_folder(root, base_path, seed))
        loaded[seed] = (model, export_onnx(model, spec.task, root / f"plain-{seed}.onnx"))
    return loaded


def _gold_accuracy(model, tokenizer) -> float:
    """Accuracy of `model` on the first DEV_EXAMPLES SST-2 dev sentences, computed here one by one."""
    examples = readers.read_sst2(SST2 / "dev.tsv")[:DEV_EXAMPLES]
    right = 0
    with torch.inference_mode():
        for example in examples:
            encoded = encode_classification(tokenizer, example.text, max_length=SPEC.max_seq_length)
            ids = torch.tensor([encoded.input_ids])
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                           token_type_ids=torch.tensor([encoded.token_type_ids]))["logits"][0]
            right += int(int(logits.argmax()) == int(example.label))
    return 100.0 * right / len(examples)


def test_static_recipe_calibrates_and_keeps_the_head_and_last_ffn_in_fp32(models, tokenizer, tmp_path):
    model, plain = models[0]
    items = calibration.model_inputs(SPEC, tokenizer, SST2 / "train.tsv", 16)
    assert len(items) == 16 and [len(i) for i in items] == sorted(len(i) for i in items)
    target = precision.to_int8(plain, tmp_path / "static.onnx", "static-minmax", calibration.batches(items))
    graph = onnx.load(str(target)).graph
    dequantized = {o for node in graph.node if node.op_type == "DequantizeLinear" for o in node.output}
    matmuls = {node.name: node for node in graph.node if node.op_type == "MatMul"}
    quantized = {name for name, node in matmuls.items() if any(i in dequantized for i in node.input)}
    roles = precision.matmul_roles(plain)
    assert set(roles) >= {"L5 ffn_out", "L0 qkv"}
    assert not quantized & set(roles.get("head", []) + roles["L5 ffn_out"])  # kept in fp32
    # The pooler and classifier of a sequence head are Gemm nodes: never quantized.
    gemms = [node for node in graph.node if node.op_type == "Gemm"]
    assert gemms and not any(i in dequantized for node in gemms for i in node.input)
    assert set(roles["L0 qkv"] + roles["L4 ffn_out"] + roles["L5 ffn_in"]) <= quantized
    # It runs, and stays close to fp32 on real inputs.
    feeds = calibration.batches(calibration.model_inputs(SPEC, tokenizer, SST2 / "dev.tsv", 16, seed=None))
    fp32, _ = create_session(plain, "fp32", 2)
    int8, _ = create_session(target, "int8", 2)
    diffs = [np.abs(fp32.run(None, f)[0] - int8.run(None, f)[0]).max() for f in feeds]
    assert 0 < max(diffs) < 0.5


def test_metric_gate_scores_gold_answers_and_passes_only_within_half_a_point(models, tokenizer):
    model, plain = models[0]
    other, _ = models[1]
    session, _ = create_session(plain, "fp32", 2)
    same = parity.metric_gate(SPEC, tokenizer, SST2 / "dev.tsv", torch_item_runner(model), onnx_item_runner(session),
                              DEV_EXAMPLES)
    expected = _gold_accuracy(model, tokenizer)
    assert same["name"] == "accuracy" and same["examples"] == DEV_EXAMPLES
    assert same["reference"] == pytest.approx(expected, abs=1e-3)
    assert same["candidate"] == pytest.approx(expected, abs=1e-3) and same["passed"]
    # Another head answers differently: its metric is its own, and the gate compares the two.
    changed = parity.metric_gate(SPEC, tokenizer, SST2 / "dev.tsv", torch_item_runner(model), torch_item_runner(other),
                                 DEV_EXAMPLES)
    other_accuracy = _gold_accuracy(other, tokenizer)
    assert changed["candidate"] == pytest.approx(other_accuracy, abs=1e-3)
    assert changed["passed"] == (other_accuracy >= expected - 0.5)
    assert f"task-metric gate {'passed' if changed['passed'] else 'FAILED'}" in parity.format_metric(changed)


def test_confidence_is_the_reference_probability_margin(models, tokenizer):
    model, _ = models[0]
    examples, _ = parity.parity_slice(SPEC, tokenizer, parity.default_data_dir(), 6)
    _, outputs, _ = parity.run_pair(examples, "classification", torch_runner(model, ["logits"]),
                                    torch_runner(model, ["logits"]))
    for example, output in zip(examples, outputs):
        probs = torch.softmax(torch.tensor(output[0]["logits"], dtype=torch.float64), -1).sort().values
        assert parity.confidence(SPEC, example, output) == pytest.approx(float(probs[-1] - probs[-2]), abs=1e-9)
