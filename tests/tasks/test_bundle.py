"""The bundle loader: a bundle written by write_manifest loads; every kind of damage is refused by name.

The model here is a tiny real ONNX graph (ids -> embedding -> mean -> 2 logits) built with
onnx.helper, so these tests need neither torch nor an export; tests/export covers real exports.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from export.bundle_writing import write_manifest
from tasks.bundle_checks import check_examples, load_bundle
from tasks.runtime.bundle import FORMAT_VERSION, MANIFEST_FILE, MODEL_FILE, TOKENIZER_FILE, BundleError, find_bundles
from tasks.runtime.onnx_session import CPU, choose_provider, create_session
from tasks.runtime.spec import TaskSpec

onnx = pytest.importorskip("onnx")


def tiny_classifier_onnx(vocab_size: int, path: Path) -> None:
    """input_ids (batch, sequence) -> mean of a random embedding -> logits (batch, 2)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    embedding = numpy_helper.from_array(rng.standard_normal((vocab_size, 8)).astype(np.float32), "embedding")
    projection = numpy_helper.from_array(rng.standard_normal((8, 2)).astype(np.float32), "projection")
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["embedded"]),
        helper.make_node("ReduceMean", ["embedded"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "projection"], ["logits"]),
    ]
    output = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])
    graph = helper.make_graph(nodes, "tiny", inputs, [output], initializer=[embedding, projection])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def classification_manifest() -> dict:
    spec = TaskSpec(task="classification", labels=["negative", "positive"], max_seq_length=64)
    return {
        "task": spec.task,
        "labels": spec.labels,
        "problem_type": "single_label_classification",
        "task_settings": {"max_seq_length": 64, "doc_stride": 128, "max_query_length": 64,
                          "version_2_with_negative": False, "null_score_diff_threshold": 0.0},
        "precision": "fp32",
        "execution_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
        "providers_validated": ["CPUExecutionProvider"],
        "opset": 17,
        "inputs": [{"name": n, "dtype": "int64", "shape": ["batch", "sequence"]}
                   for n in ("input_ids", "attention_mask", "token_type_ids")],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 2]}],
        "source": {"checkpoint": "nowhere", "weights_sha256": "0" * 64, "dev_metrics": {"accuracy": 0.9}},
        "model_config": {"hidden_size": 8, "num_attention_heads": 1, "num_hidden_layers": 0, "vocab_size": 30522},
    }


@pytest.fixture
def bundle_folder(tmp_path, base_path, tokenizer) -> Path:
    folder = tmp_path / "repository" / "sst2-tiny"
    folder.mkdir(parents=True)
    shutil.copy(base_path / TOKENIZER_FILE, folder / TOKENIZER_FILE)
    tiny_classifier_onnx(tokenizer.get_vocab_size(), folder / MODEL_FILE)
    write_manifest(folder, classification_manifest())
    return folder


def test_written_bundle_loads_with_hashes_spec_and_paths(bundle_folder):
    bundle = load_bundle(bundle_folder)
    assert bundle.format_version == FORMAT_VERSION
    assert bundle.name == "sst2-tiny"
    assert bundle.model_path == bundle_folder / MODEL_FILE
    assert bundle.tokenizer_path == bundle_folder / TOKENIZER_FILE
    assert set(bundle.files) == {MODEL_FILE, TOKENIZER_FILE}
    assert bundle.files[MODEL_FILE].bytes == (bundle_folder / MODEL_FILE).stat().st_size
    assert bundle.input_names == ["input_ids", "attention_mask", "token_type_ids"]
    assert bundle.output_names == ["logits"]
    assert bundle.encoder_config["hidden_size"] == 8
    assert bundle.berth_version and bundle.created_at.endswith("Z")
    spec = bundle.spec()
    assert spec.task == "classification" and spec.labels == ["negative", "positive"]
    assert spec.max_seq_length == 64 and spec.dev_metrics == {"accuracy": 0.9}
    # the manifest on disk keeps the contract's key names
    on_disk = json.loads((bundle_folder / MANIFEST_FILE).read_text())
    assert "model_config" in on_disk and "path" not in on_disk


def test_session_runs_the_bundle_on_the_cpu(bundle_folder, tokenizer):
    from tasks.runtime.batching import pad_batch
    from tasks.runtime.tokenizer import encode

    bundle = load_bundle(bundle_folder)
    session, provider = create_session(bundle.model_path, bundle.precision, intra_op_threads=1)
    assert provider in ("CUDAExecutionProvider", CPU)
    batch = pad_batch([encode(tokenizer, "a gripping film"), encode(tokenizer, "dull and far too long")])
    (logits,) = session.run(bundle.output_names, batch)
    assert logits.shape == (2, 2) and logits.dtype == np.float32


def test_provider_choice():
    assert choose_provider("int8", available=["CUDAExecutionProvider", CPU]) == CPU
    assert choose_provider("fp32", available=["CUDAExecutionProvider", CPU]) == "CUDAExecutionProvider"
    assert choose_provider("fp16", available=[CPU]) == CPU
    assert choose_provider("fp32", prefer_gpu=False, available=["CUDAExecutionProvider", CPU]) == CPU


def test_tampered_model_is_refused_naming_the_file(bundle_folder):
    model = bundle_folder / MODEL_FILE
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    model.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"model\.onnx: sha256 differs"):
        load_bundle(bundle_folder)
    load_bundle(bundle_folder, verify_hashes=False)  # the size still matches: only the hash can tell


def test_truncated_model_is_refused_naming_the_file(bundle_folder):
    model = bundle_folder / MODEL_FILE
    model.write_bytes(model.read_bytes()[:100])
    with pytest.raises(BundleError, match=r"model\.onnx: size 100 bytes differs"):
        load_bundle(bundle_folder, verify_hashes=False)


def test_missing_tokenizer_is_refused(bundle_folder):
    (bundle_folder / TOKENIZER_FILE).unlink()
    with pytest.raises(BundleError, match=r"tokenizer\.json: missing"):
        load_bundle(bundle_folder)


def test_unknown_format_version_is_refused(bundle_folder):
    manifest_path = bundle_folder / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=f"unknown format_version {FORMAT_VERSION + 1}"):
        load_bundle(bundle_folder)


def test_malformed_or_invalid_manifest_is_refused(bundle_folder):
    manifest_path = bundle_folder / MANIFEST_FILE
    text = manifest_path.read_text()
    manifest_path.write_text(text[: len(text) // 2])
    with pytest.raises(BundleError, match="malformed JSON"):
        load_bundle(bundle_folder)
    manifest = json.loads(text)
    manifest["precision"] = "int4"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="precision"):
        load_bundle(bundle_folder)
    manifest["precision"] = "fp32"
    manifest["outputs"] = [{"name": "start_logits", "dtype": "float32", "shape": ["batch", "sequence"]}]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="expects outputs"):
        load_bundle(bundle_folder)


def test_not_a_bundle(tmp_path):
    with pytest.raises(BundleError, match="bundle.json: missing"):
        load_bundle(tmp_path)
    with pytest.raises(BundleError, match="not a folder"):
        load_bundle(tmp_path / "absent")


def test_write_manifest_needs_the_files(tmp_path):
    with pytest.raises(BundleError, match="model.onnx: missing"):
        write_manifest(tmp_path, classification_manifest())


def test_find_bundles(bundle_folder):
    repository = bundle_folder.parent
    (repository / "not-a-bundle").mkdir()
    shutil.copytree(bundle_folder, repository / "another")
    assert find_bundles(repository) == [repository / "another", bundle_folder]
    assert find_bundles(repository / "absent") == []


def test_examples_are_kept_and_must_fit_the_task(bundle_folder):
    manifest = json.loads((bundle_folder / MANIFEST_FILE).read_text())
    examples = ["A gripping film.", "Dull and far too long."]
    write_manifest(bundle_folder, {**manifest, "examples": examples})
    assert load_bundle(bundle_folder).examples == examples
    for bad, problem in (([""], r"examples\[0\] \(classification\): expected a non-empty text"),
                         ([{"text": "a", "text_pair": "b"}], "expected a non-empty text"),
                         ("A gripping film.", "examples: Input should be a valid list")):
        with pytest.raises(BundleError, match=problem):
            write_manifest(bundle_folder, {**manifest, "examples": bad})


@pytest.mark.parametrize("task,good,bad,problem", [
    ("pair", {"text": "a", "text_pair": "b"}, {"text": "a"}, "exactly the fields text, text_pair"),
    ("qa", {"question": "Who?", "context": "Ada did."}, {"question": "Who?", "context": " "},
     "context must be a non-empty text"),
    ("multiple-choice", {"context": "It rained.", "choices": ["wet", "dry"]},
     {"context": "It rained.", "choices": ["wet"]}, "choices must be a list of 2 or more"),
    ("ner", "Ada Lovelace lived in London.", {"text": "Ada"}, "expected a non-empty text"),
])
def test_examples_of_each_task_shape(task, good, bad, problem):
    check_examples(task, [good])
    with pytest.raises(BundleError, match=problem):
        check_examples(task, [good, bad])
