"""The sessions of one model share one copy of its weights (tasks/runtime/onnx_weights.py,
tasks/runtime/onnx_session.py's MemoryPolicy): the initializers taken out of the model are the onnx package's own
reading of them, sessions built on the shared copy answer as ONNX Runtime's default session on the original file
(fp32 within the export parity gate's tolerance; int8 bit for bit with prepacked weights), and a real server with
the policy on and off gives the same answers."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from tasks.runtime import onnx_session
from tasks.runtime.onnx_weights import large_initializers
from tests.service.conftest import ServerProcess

onnx = pytest.importorskip("onnx")
FP32_MAX_ABS_DIFF = 1e-4  # the export parity gate's fp32 bound (export/parity.py)
TEXTS = ["A charming and often affecting journey.", "Unflinchingly bleak and desperate.",
         "It is a film of great beauty, " * 20]


@pytest.fixture(scope="module")
def int8_model(bundle_repository, tmp_path_factory) -> Path:
    """The sentiment bundle's graph quantized as export quantizes int8 bundles (dynamic, per channel off)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target = tmp_path_factory.mktemp("int8") / "model.onnx"
    source = bundle_repository / "sentiment" / "model.onnx"
    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
    return target


def feeds(session, batch: int, length: int, seed: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(1000, 20_000, (batch, length))
    out = {}
    for node in session.get_inputs():
        if "mask" in node.name:
            out[node.name] = np.ones((batch, length), np.int64)
        elif "type" in node.name:
            out[node.name] = np.zeros((batch, length), np.int64)
        else:
            out[node.name] = ids
    return out


@pytest.mark.parametrize("which", ["fp32", "int8"])
def test_the_shared_weights_are_the_onnx_packages_reading(bundle_repository, int8_model, which):
    from onnx import numpy_helper

    path = bundle_repository / "sentiment" / "model.onnx" if which == "fp32" else int8_model
    weights = large_initializers(path.read_bytes())
    model = onnx.load(str(path))
    expected = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
                if t.raw_data and len(t.raw_data) >= 1024}
    assert expected and set(weights) == set(expected)
    for name, values in weights.items():
        assert values.dtype == expected[name].dtype and np.array_equal(values, expected[name]), name
        assert values.flags.owndata  # not a view keeping the model's bytes alive


@pytest.mark.parametrize("prepacking", [False, True])
@pytest.mark.parametrize("which", ["fp32", "int8"])
def test_sessions_on_shared_weights_answer_as_the_default_session(bundle_repository, int8_model, which,
                                                                  prepacking):
    path = bundle_repository / "sentiment" / "model.onnx" if which == "fp32" else int8_model
    data = path.read_bytes()
    try:
        onnx_session.set_memory_policy(onnx_session.MemoryPolicy())
        reference, _ = onnx_session.create_session(path, which, 2, prefer_gpu=False)
        onnx_session.set_memory_policy(onnx_session.MemoryPolicy.serving(prepacking))
        wide, _ = onnx_session.create_session(data, which, 2, prefer_gpu=False)
        narrow, _ = onnx_session.create_session(data, which, 1, prefer_gpu=False)
    finally:
        onnx_session.set_memory_policy(onnx_session.MemoryPolicy())
    assert wide.berth_shared_weights is narrow.berth_shared_weights is not None  # one copy for both
    for batch, length, seed in [(1, 9, 0), (4, 40, 1), (2, 128, 2)]:
        expected = reference.run(None, feeds(reference, batch, length, seed))
        for session in (wide, narrow):
            got = session.run(None, feeds(session, batch, length, seed))
            for e, g in zip(expected, got):
                if which == "int8" and not prepacking:
                    assert np.abs(e - g).max() <= 0.05  # the unpacked int8 GEMM rounds differently
                elif which == "int8":
                    assert np.array_equal(e, g)
                else:
                    assert np.abs(e - g).max() <= FP32_MAX_ABS_DIFF


def test_a_server_answers_the_same_with_shared_memory_on_and_off(bundle_repository, tmp_path):
    answers = {}
    for shared in ("true", "false"):
        proc = ServerProcess(bundle_repository, tmp_path / f"shared-{shared}.log",
                             args=["--model", "sentiment", "--model", "embeddings"],
                             env={"BERTH_ORT_SHARED_MEMORY": shared})
        try:
            proc.wait_ready()
            labels = httpx.post(proc.url + "/v1/classify", json={"inputs": TEXTS, "model": "sentiment",
                                                                  "top_k": 2}, timeout=60)
            vectors = httpx.post(proc.url + "/v1/embed", json={"inputs": TEXTS, "model": "embeddings"},
            timeout=60)
            assert labels.status_code == vectors.status_code == 200, proc.log()
            answers[shared] = (labels.json()["results"], vectors.json()["results"])
        finally:
            proc.stop()
    (labels_on, vectors_on), (labels_off, vectors_off) = answers["true"], answers["false"]
    assert [[r["label"] for r in result] for result in labels_on] == \
        [[r["label"] for r in result] for result in labels_off]
    for on, off in zip(labels_on, labels_off):
        assert np.allclose([r["score"] for r in on], [r["score"] for r in off], atol=FP32_MAX_ABS_DIFF)
    for on, off in zip(vectors_on, vectors_off):
        assert np.abs(np.array(on["embedding"]) - np.array(off["embedding"])).max() <= FP32_MAX_ABS_DIFF


def test_a_cpu_session_from_bytes_lets_go_of_them_and_answers_the_same(bundle_repository, int8_model):
    """onnxruntime's Python session keeps the model's bytes for a provider fallback a CPU session cannot use: a
    served model held its whole serialized file (62 MiB for an int8 MiniLM) beside its weights. Released, the
    session answers bit for bit as the session that still holds them, with the serving policy and without."""
    import sys

    import onnxruntime

    data = int8_model.read_bytes()
    references = sys.getrefcount(data)
    holding = onnxruntime.InferenceSession(data, sess_options=onnx_session.session_options(1),
                                           providers=["CPUExecutionProvider"])
    assert sys.getrefcount(data) == references + 1  # what ORT does by itself
    try:
        for policy in (onnx_session.MemoryPolicy(), onnx_session.MemoryPolicy.serving()):
            onnx_session.set_memory_policy(policy)
            session, _ = onnx_session.create_session(data, "int8", 1, prefer_gpu=False)
            assert sys.getrefcount(data) == references + 1  # nothing of this session refers to the bytes
            for batch, length, seed in [(1, 9, 0), (3, 64, 1)]:
                for expected, got in zip(holding.run(None, feeds(holding, batch, length, seed)),
                                         session.run(None, feeds(session, batch, length, seed))):
                    assert np.array_equal(expected, got)
    finally:
        onnx_session.set_memory_policy(onnx_session.MemoryPolicy())
    path_session, _ = onnx_session.create_session(int8_model, "int8", 1, prefer_gpu=False)
    assert path_session._model_bytes is None  # a path: nothing held either way


@pytest.mark.parametrize("parallel_passes,cores,expected", [(0, 2, "second"), (1, 2, None), (0, 1, None)])
def test_a_model_has_a_narrow_second_session_only_where_it_runs_passes_side_by_side(
        bundle_repository, parallel_passes, cores, expected):
    """One core, or parallel_passes=1: no second session (measured: ~20 MiB idle a small int8 model, its
    prepacked GEMM weights and structures); otherwise a narrow one on cores // parallel_passes threads."""
    from service.compute_slots import ComputeSlots
    from service.models import MODEL_FILE, OnnxEngine, narrow, verified_bytes
    from service.settings import ServiceSettings
    from tasks.bundle_checks import load_bundle

    bundle = load_bundle(bundle_repository / "sentiment")
    data = verified_bytes(bundle, MODEL_FILE)
    wide = OnnxEngine(bundle, cores, prefer_gpu=False, model_bytes=data)
    engine, threads = narrow(wide, bundle, data, ServiceSettings(device="cpu", parallel_passes=parallel_passes),
                             ComputeSlots(cores))
    if expected is None:
        assert engine is None and threads == wide.threads
    else:
        assert engine is not None and engine is not wide and engine.session is not wide.session
        assert threads == engine.threads == 1
