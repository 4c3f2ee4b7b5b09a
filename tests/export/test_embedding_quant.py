"""int8 word embeddings (export/embedding_quant.py): the word-embedding table as uint8 codes looked up by ONNX
Runtime's GatherBlockQuantized, in an int8 recipe and on an existing int8 bundle.

The model is the real all-MiniLM-L6-v2 checkpoint exported as the `embedding` task; the text is real (the
shipped SQuAD sample's paragraphs). The tolerances were measured here (noted beside each) and the expected
values computed in the tests themselves: the codes' half-step bound from their scales, the op's rows from
numpy, the answers by comparing sessions of the graphs with and without the step.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from export import embedding_quant, precision  # noqa: E402
from export.bundle_builder import export_bundle  # noqa: E402
from export.onnx_export import export_onnx, load_finetuned  # noqa: E402
from export.settings import ExportSettings  # noqa: E402
from tasks.bundle_checks import load_bundle  # noqa: E402
from tasks.runtime.onnx_session import create_session  # noqa: E402

SQUAD = Path(__file__).resolve().parents[2] / "data" / "samples" / "squad" / "dev.json"
VOCAB, HIDDEN = 30522, 384
# Sentence embeddings (unit vectors) of the graph with int8 word embeddings against the same graph without:
# fp32 graphs measured 0.0015 max |Δ| (cosine > 0.99999); int8 graphs move more, because a small change in the
# activations moves the dynamic quantization ranges of every MatMul after it (measured: cosine >= 0.9985).
FP32_MAX_ABS = 0.005
FP32_MIN_COSINE = 0.9999
INT8_MIN_COSINE = 0.995


@pytest.fixture(scope="module")
def plain(tmp_path_factory, base_path) -> Path:
    """The real checkpoint as the embedding task's fp32 graph (mean pooling, normalized)."""
    model, spec, _ = load_finetuned(base_path, "embedding")
    return export_onnx(model, spec.task, tmp_path_factory.mktemp("embq") / "plain.onnx")


@pytest.fixture(scope="module")
def feeds(tokenizer) -> dict[str, np.ndarray]:
    """24 real paragraphs, cut to 128 tokens, padded: a batch as the service pads one."""
    data = json.loads(SQUAD.read_text(encoding="utf-8"))
    texts = [p["context"] for article in data["data"] for p in article["paragraphs"]][:24]
    encoded = [tokenizer.encode(text).ids[:128] for text in texts]
    width = max(len(ids) for ids in encoded)
    ids = np.zeros((len(encoded), width), np.int64)
    mask = np.zeros_like(ids)
    for row, tokens in enumerate(encoded):
        ids[row, :len(tokens)] = tokens
        mask[row, :len(tokens)] = 1
    assert 0 < mask.sum(1).min() < width  # real padding
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def sentence_embeddings(path: Path, feeds: dict[str, np.ndarray], which: str) -> np.ndarray:
    session, _ = create_session(path, which, 2, prefer_gpu=False)
    return session.run(["sentence_embedding"], feeds)[0]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def word_table(path: Path) -> np.ndarray:
    from onnx import numpy_helper

    return next(numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer
                if list(t.dims) == [VOCAB, HIDDEN])


def test_the_codes_are_within_half_a_step_of_the_real_table(plain):
    table = word_table(plain)
    codes, scales, zeros = embedding_quant.quantize_table(table)
    blocks = -(-HIDDEN // embedding_quant.BLOCK_SIZE)
    assert codes.dtype == np.uint8 and codes.shape == table.shape
    assert scales.shape == zeros.shape == (VOCAB, blocks) and scales.dtype == np.float32
    restored = embedding_quant.dequantize_table(codes, scales, zeros)
    half_step = np.repeat(scales, embedding_quant.BLOCK_SIZE, axis=1)[:, :HIDDEN] / 2
    assert (np.abs(restored - table) <= half_step * (1 + 1e-5) + 1e-7).all()
    # 8 bits a value: the step is 1/255 of each block's range (which includes 0)
    grouped = table.reshape(VOCAB, blocks, -1)
    span = np.maximum(grouped.max(2), 0) - np.minimum(grouped.min(2), 0)
    assert np.allclose(scales, span / 255, rtol=1e-6)


def test_the_lookup_is_replaced_and_reads_the_rows_numpy_dequantizes(plain, tmp_path):
    import onnxruntime

    target = tmp_path / "q.onnx"
    record = embedding_quant.quantize_word_embeddings(plain, target)
    graph = onnx.load(str(target)).graph
    ops = [node for node in graph.node if node.op_type == "GatherBlockQuantized"]
    assert len(ops) == 1 and ops[0].domain == "com.microsoft" and ops[0].input[1] == "input_ids"
    assert not any(list(t.dims) == [VOCAB, HIDDEN] and t.data_type == onnx.TensorProto.FLOAT
                   for t in graph.initializer)  # the fp32 table is gone
    assert record["bytes_before"] == VOCAB * HIDDEN * 4
    assert record["bytes_after"] < record["bytes_before"] * 0.3
    assert plain.stat().st_size - target.stat().st_size > 31 * 2**20
    # the op gathers exactly (codes - zero point) * scale for the ids given
    codes, scales, zeros = embedding_quant.quantize_table(word_table(plain))
    expected = embedding_quant.dequantize_table(codes, scales, zeros)
    node = ops[0]
    probe = onnx.helper.make_model(
        onnx.helper.make_graph(
            [node], "probe", [onnx.helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, [None, None])],
            [onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)],
            [t for t in graph.initializer if t.name in node.input]),
        opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("com.microsoft", 1)])
    session = onnxruntime.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([[101, 2023, 30521, 0], [7592, 102, 1996, 4]])
    assert np.array_equal(session.run(None, {"input_ids": ids})[0], expected[ids])


def test_alone_it_moves_fp32_sentence_embeddings_within_the_stated_tolerance(plain, feeds, tmp_path):
    target = tmp_path / "q.onnx"
    embedding_quant.quantize_word_embeddings(plain, target)
    before, after = sentence_embeddings(plain, feeds, "fp32"), sentence_embeddings(target, feeds, "fp32")
    assert 0 < np.abs(before - after).max() <= FP32_MAX_ABS
    assert cosines(before, after).min() >= FP32_MIN_COSINE


def test_the_int8_recipe_with_uint8_embeddings_answers_as_the_one_without(plain, feeds, tmp_path):
    without = precision.to_int8(plain, tmp_path / "int8.onnx", "dynamic-keep-early-ffn")
    with_ = precision.to_int8(plain, tmp_path / "int8-emb8.onnx", "dynamic-keep-early-ffn-emb8")
    assert precision.RECIPES["dynamic-keep-early-ffn-emb8"].describe()["word_embeddings"] == "uint8"
    assert without.stat().st_size - with_.stat().st_size > 31 * 2**20  # 44.7 MiB table -> 12.9 MiB
    ops = {node.op_type for node in onnx.load(str(with_)).graph.node}
    assert {"GatherBlockQuantized", "MatMulInteger"} <= ops
    reference = sentence_embeddings(plain, feeds, "fp32")
    a, b = sentence_embeddings(without, feeds, "int8"), sentence_embeddings(with_, feeds, "int8")
    assert cosines(a, b).min() >= INT8_MIN_COSINE
    # against fp32, the step costs little next to the MatMuls' own int8 drift
    assert cosines(reference, b).min() >= cosines(reference, a).min() - 0.002


def test_a_fused_or_tied_table_is_left_alone_with_the_reason(plain, tmp_path):
    from export.optimize import optimize_bert

    fused = tmp_path / "fused.onnx"
    optimize_bert(plain, fused, 12, HIDDEN)
    assert any(node.op_type == "EmbedLayerNormalization" for node in onnx.load(str(fused)).graph.node)
    with pytest.raises(embedding_quant.NotQuantizable, match="EmbedLayerNormalization"):
        embedding_quant.quantize_word_embeddings(fused, tmp_path / "never.onnx")
    assert not (tmp_path / "never.onnx").exists()


def test_an_existing_int8_bundle_is_converted_gated_and_still_loads(base_path, feeds, tmp_path):
    # an int8 bundle as exported before the 8-bit embeddings were the default
    bundle = export_bundle(ExportSettings(
        model_folder=base_path, out=tmp_path / "embeddings", precision="int8", task="embedding", optimize="never",
        parity_examples=16, threads=2, int8_recipe="dynamic-keep-early-ffn",
        allow_batch_dependent=True))  # per-tensor scales: batch-dependent, as bundles were then
    assert bundle.optimization["int8"]["word_embeddings"] == "fp32"
    converted_path = tmp_path / "converted" / "embeddings"
    record = embedding_quant.convert_bundle(bundle.path, converted_path, examples=16, threads=2)
    converted = load_bundle(converted_path)  # hashes and manifest digest rewritten
    assert converted.optimization["int8"]["word_embeddings"]["table"] == record["table"]
    gate = record["gate"]
    assert gate["passed"] and gate["parity"]["examples"] == 16 and gate["against"] == "the unconverted bundle"
    moved = gate["parity"]["max_abs_diff_by_output"]
    # measured on this slice (16 SST-2 sentences): 0.103 on the unit sentence vectors, 0.40 on the per-layer token
    # states (values up to ~10), as much as the int8 bundle itself differs from PyTorch there (0.107, 0.52): a
    # small change of the embeddings moves every dynamic activation range after it
    assert 0 < moved["sentence_embedding"] < 0.15 and moved["hidden_states"] < 1.0
    assert bundle.files["model.onnx"].bytes - converted.files["model.onnx"].bytes > 31 * 2**20
    assert (load_bundle(bundle.path).files["model.onnx"].sha256 == bundle.files["model.onnx"].sha256)  # untouched
    a = sentence_embeddings(bundle.model_path, feeds, "int8")
    b = sentence_embeddings(converted.model_path, feeds, "int8")
    assert cosines(a, b).min() >= INT8_MIN_COSINE
    with pytest.raises(ValueError, match="quantized already"):
        embedding_quant.convert_bundle(converted_path, tmp_path / "twice")


def test_the_recipe_passes_the_export_gate_against_pytorch(base_path, tmp_path):
    """`berth export --precision int8` (the default recipe, with the 8-bit embeddings): the parity gate against
    PyTorch (the embedding task: cosine agreement on every example) passes, and its figures are those of the recipe
    without the step, within what int8 noise moves them."""
    options = {"model_folder": base_path, "precision": "int8", "task": "embedding", "optimize": "never",
               "parity_examples": 16, "threads": 2}
    # per-tensor scales: batch-dependent
    plain_int8 = export_bundle(ExportSettings(out=tmp_path / "int8", int8_recipe="dynamic-keep-early-ffn",
                                              allow_batch_dependent=True, **options))
    emb8 = export_bundle(ExportSettings(out=tmp_path / "emb8", **options))  # the default recipe
    assert emb8.optimization["int8"]["recipe"] == precision.DEFAULT_RECIPE == "rowwise-keep-early-ffn-emb8"
    assert emb8.parity["passed"] and emb8.parity["agreement"] == 1.0
    assert emb8.optimization["int8"]["word_embeddings"] == "uint8"
    ops = {node.op_type for node in onnx.load(str(emb8.model_path)).graph.node}
    assert "GatherBlockQuantized" in ops
    a, b = plain_int8.parity["max_abs_diff_by_output"], emb8.parity["max_abs_diff_by_output"]
    assert b["sentence_embedding"] < max(0.15, 1.5 * a["sentence_embedding"])
    assert emb8.parity["mean_abs_diff"] < 1.5 * plain_int8.parity["mean_abs_diff"]
    with pytest.raises(ValueError, match="quantized already"):
        embedding_quant.convert_bundle(emb8.path, tmp_path / "again")
