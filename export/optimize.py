"""ONNX Runtime's offline transformer optimizer for BERT, and a measurement that decides whether to keep it.

The offline pass fuses embeddings + LayerNorm (EmbedLayerNormalization), attention (Attention),
residual + LayerNorm (SkipLayerNormalization) and bias + GELU (BiasGelu). On the CPU, an
InferenceSession's own graph optimizations already fuse much of this, so the offline graph is not
always faster: `fastest_graph` times the candidates on the provider at hand and keeps
the faster, and the manifest says why.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from tasks.runtime.onnx_session import create_session

log = logging.getLogger(__name__)

# The fusions worth reporting, in the optimizer's names.
FUSIONS = ("EmbedLayerNormalization", "Attention", "MultiHeadAttention", "SkipLayerNormalization",
           "LayerNormalization", "BiasGelu", "Gelu", "FastGelu")


def optimize_bert(
    source: str | Path, target: str | Path, num_heads: int, hidden_size: int, use_gpu: bool = False
) -> dict[str, int]:
    """Run the offline BERT optimizer on `source`, save to `target`; return the fusions that applied (count > 0).

    `opt_level=0`: only the transformer fusions, so the saved graph stays portable across
    providers; the session applies its own (provider-specific) optimizations at load.
    """
    from onnxruntime.transformers import optimizer

    model = optimizer.optimize_model(
        str(source), model_type="bert", num_heads=num_heads, hidden_size=hidden_size, opt_level=0, use_gpu=use_gpu
    )
    statistics = model.get_fused_operator_statistics()
    model.save_model_to_file(str(target))
    fusions = {name: int(statistics.get(name, 0)) for name in FUSIONS if statistics.get(name, 0)}
    log.info("offline optimizer: %s", ", ".join(f"{k} x{v}" for k, v in fusions.items()) or "no fusion applied")
    return fusions


def synthetic_batch(batch_size: int, sequence_length: int, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random token ids shaped like a real batch (first row padded to half length): for timing only."""
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(1000, min(vocab_size, 30000), (batch_size, sequence_length), dtype=np.int64)
    input_ids[:, 0] = 101 if vocab_size > 102 else 1
    attention_mask = np.ones_like(input_ids)
    if batch_size > 1:
        attention_mask[0, sequence_length // 2:] = 0
        input_ids[0, sequence_length // 2:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": np.zeros_like(input_ids)}


def time_session(session: Any, feeds: dict[str, np.ndarray], repeats: int = 5, warmup: int = 1) -> list[float]:
    """Seconds per run of `session` on `feeds`, one figure per repeat (after `warmup` untimed runs)."""
    for _ in range(warmup):
        session.run(None, feeds)
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        session.run(None, feeds)
        seconds.append(time.perf_counter() - started)
    return seconds


def fastest_graph(
    candidates: dict[str, Path],
    feeds: dict[str, np.ndarray],
    precision: str = "fp32",
    intra_op_threads: int = 0,
    prefer_gpu: bool = True,
    rounds: int = 3,
    min_gain: float = 0.03,
) -> tuple[str, dict[str, Any]]:
    """Time each candidate graph on the preferred provider and return the fastest's name and the figures.

    Candidates are timed in alternating rounds (A B A B ...) and compared by their best round's
    median, so a burst of load from another process on this shared machine hurts both alike. A
    candidate other than the first must be faster by more than `min_gain` (3%) to be chosen: within
    the noise, the first (the plain graph) is kept.
    """
    sessions = {}
    provider = "CPUExecutionProvider"
    for name, path in candidates.items():
        sessions[name], provider = create_session(path, precision, intra_op_threads, prefer_gpu)
    medians: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, session in sessions.items():
            medians[name].append(float(np.median(time_session(session, feeds, repeats=3))))
    best = {name: min(values) for name, values in medians.items()}
    # The first candidate (the simpler graph) wins unless another is faster by more than the noise.
    first = next(iter(best))
    winner = min(best, key=best.get)
    if best[winner] > best[first] * (1 - min_gain):
        winner = first
    shape = list(feeds["input_ids"].shape)
    figures = {
        "provider": provider,
        "shape": shape,
        "intra_op_threads": intra_op_threads,
        "seconds_per_batch": {name: round(value, 5) for name, value in best.items()},
        "min_gain": min_gain,
    }
    return winner, figures
