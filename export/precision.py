"""fp16 and int8 variants of an fp32 ONNX graph.

- fp16 (for the CUDA provider): ONNX Runtime's float16 converter with `keep_io_types=True`, so
  the bundle's inputs and outputs stay int64 / float32 and the service never sees fp16. Out-of-range
  constants are clamped to the fp16 range by the converter (the attention mask's "most negative
  float" becomes -65504, still a zero weight after softmax). The plain ONNX LayerNormalization and
  Softmax nodes stay in fp32 (`FP32_OPS`): their reductions are where fp16 overflows to NaN/inf.
  The optimizer's fused ops (Attention, SkipLayerNormalization, EmbedLayerNormalization) are
  converted: their ORT kernels accumulate in fp32 internally, and blocking them makes the converter
  write a graph ORT refuses (fp32 and fp16 inputs bound to one type parameter).
- int8 (for the CPU provider only; no CUDA kernels): one of `RECIPES`, chosen by measurement
  (bench/int8_drift.py, docs/ENGINE.md §3). Only the weight MatMuls are quantized (`op_types`
  MatMul): ORT's default list also quantizes the word-embedding Gather. Weights are per output
  channel. On x86 CPUs without VNNI (AVX2 only, where the recipes were first measured) the u8 x s8
  kernels can saturate their int16 intermediate sums, so s8 weights get a 7-bit range
  (`reduce_range`); u8 x u8 avoids it.
  Sensitive MatMuls (the task head, the last layer's FFN output) can stay in fp32 (`keep_fp32`).
  Activation scales are per token row in the `rowwise-*` recipes (export/rowwise_quant.py; the default): an
  input's answer is then the same alone or in any batch, which ORT's one scale per batch tensor does not give.
  `word_embeddings="uint8"` also stores the word-embedding table as 8-bit codes with a scale and zero point per
  block of a row, looked up by ORT's GatherBlockQuantized (export/embedding_quant.py): the MatMul-only recipes
  otherwise leave that 45 MiB fp32 table (MiniLM) in every int8 bundle. Applied before the parity and metric
  gates, like the rest of the recipe.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Computed in fp32 inside an fp16 graph: reductions that overflow or lose too much in fp16.
# (Opset 17 exports LayerNorm as one LayerNormalization node, so no decomposed Pow/ReduceMean to guard.)
FP32_OPS = ("LayerNormalization", "Softmax")


def to_fp16(source: str | Path, target: str | Path, keep_fp32_ops: tuple[str, ...] = FP32_OPS) -> Path:
    """Convert `source` to fp16 weights and compute, fp32 inputs/outputs, `keep_fp32_ops` kept in fp32."""
    import onnx
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = onnx.load(str(source))
    block = sorted(set(DEFAULT_OP_BLOCK_LIST) | set(keep_fp32_ops))
    converted = convert_float_to_float16(model, keep_io_types=True, op_block_list=block)
    onnx.save(converted, str(target))
    return Path(target)


# Weight MatMuls of the TorchScript-exported graph, by role: "L3 ffn_out", "L0 qkv", "head".
_LAYER_MATMUL = re.compile(
    r"layer\.(\d+)/(attention/self/(query|key|value)|attention/output/dense|intermediate/dense|output/dense)/")
_ROLES = {"attention/output/dense": "attn_out", "intermediate/dense": "ffn_in", "output/dense": "ffn_out"}


@dataclass(frozen=True)
class Int8Recipe:
    """How to quantize: dynamic (activation ranges at run time) or static QDQ (ranges calibrated)."""

    static: bool = False
    weight_type: str = "QInt8"  # QInt8 (7-bit with reduce_range) or QUInt8
    reduce_range: bool = True
    keep_fp32: tuple[str, ...] = ()  # kept in fp32: "head", "last_ffn_out", "L0 ffn_out", or a role in every layer
    calibrate_method: str = "MinMax"  # static only: MinMax | Percentile | Entropy
    activation_symmetric: bool = False
    op_types: tuple[str, ...] | None = ("MatMul", "Attention")  # None: ORT's default list (Gather included)
    word_embeddings: str = "fp32"  # or "uint8": GatherBlockQuantized on 8-bit codes (export/embedding_quant.py)
    # dynamic only: "tensor" (ORT's one scale per batch tensor: an item's answer moves with its batch neighbours)
    # or "row" (one scale per token row, export/rowwise_quant.py: the same answer alone or in any batch)
    activation_scales: str = "tensor"

    def describe(self) -> dict[str, Any]:
        return {"mode": "static QDQ" if self.static else "dynamic", "weight_type": self.weight_type,
                "per_channel": True, "reduce_range": self.reduce_range, "fp32_matmuls": list(self.keep_fp32),
                "op_types": list(self.op_types) if self.op_types else "onnxruntime default",
                "word_embeddings": self.word_embeddings,
                **({} if self.static else {"activation_scales": "per row (token)" if self.activation_scales == "row"
                                           else "per batch tensor"}),
                **({"calibrate_method": self.calibrate_method} if self.static else {})}


EARLY_FFN = ("head", "L0 ffn_in", "L0 ffn_out", "L1 ffn_in", "L1 ffn_out")
RECIPES = {
    "dynamic-all-ops": Int8Recipe(op_types=None),  # what berth shipped before: word embeddings quantized too
    "dynamic": Int8Recipe(),
    "dynamic-u8u8": Int8Recipe(weight_type="QUInt8", reduce_range=False),
    "dynamic-keep-head": Int8Recipe(keep_fp32=("head", "last_ffn_out")),
    "dynamic-u8u8-keep-head": Int8Recipe(weight_type="QUInt8", reduce_range=False, keep_fp32=("head", "last_ffn_out")),
    "dynamic-keep-ffn-out": Int8Recipe(keep_fp32=("head", "ffn_out")),
    "static-minmax": Int8Recipe(static=True, keep_fp32=("head", "last_ffn_out")),
    "static-u8u8-minmax": Int8Recipe(static=True, weight_type="QUInt8", reduce_range=False,
                                     keep_fp32=("head", "last_ffn_out")),
    "static-percentile": Int8Recipe(static=True, calibrate_method="Percentile", keep_fp32=("head", "last_ffn_out")),
    # Where the drift comes from on fine-tuned all-MiniLM-L6-v2 models (docs/ENGINE.md §3): the first
    # two layers' FFN (and the embedding lookup, which MatMul-only recipes leave in fp32).
    "dynamic-keep-early-ffn": Int8Recipe(keep_fp32=EARLY_FFN),
    # Every FFN MatMul in fp32, only the attention projections int8: the least drift, the least speed-up.
    "dynamic-keep-ffn": Int8Recipe(keep_fp32=("head", "ffn_in", "ffn_out")),
    "static-keep-early-ffn": Int8Recipe(static=True, keep_fp32=EARLY_FFN),
    # The same, with the word-embedding table in 8 bits too (-31.8 MiB a MiniLM bundle, in memory as on disk).
    "dynamic-keep-early-ffn-emb8": Int8Recipe(keep_fp32=EARLY_FFN, word_embeddings="uint8"),
    "dynamic-keep-ffn-emb8": Int8Recipe(keep_fp32=("head", "ffn_in", "ffn_out"), word_embeddings="uint8"),
    "static-keep-early-ffn-emb8": Int8Recipe(static=True, keep_fp32=EARLY_FFN, word_embeddings="uint8"),
    # One activation scale per token row (export/rowwise_quant.py): batch-invariant, and finer than one per tensor.
    "rowwise-keep-early-ffn-emb8": Int8Recipe(keep_fp32=EARLY_FFN, word_embeddings="uint8", activation_scales="row"),
    "rowwise-keep-ffn-emb8": Int8Recipe(keep_fp32=("head", "ffn_in", "ffn_out"), word_embeddings="uint8",
                                        activation_scales="row"),
    "rowwise-keep-head-emb8": Int8Recipe(keep_fp32=("head",), word_embeddings="uint8", activation_scales="row"),
}
# Chosen by measurement (docs/ENGINE.md §3): the early FFN MatMuls and the head in fp32, the word embeddings in 8 bits,
# s8 weights with reduce_range everywhere (a bundle exported on a VNNI machine may be served on one without), and one
# activation scale per token row: the same answer for an input alone or in any batch (the per-tensor recipes moved
# the default models' probabilities by up to 0.08 with their batch neighbours), with less drift against PyTorch.
DEFAULT_RECIPE = "rowwise-keep-early-ffn-emb8"
# What `berth build-defaults` tries, in order, before it ships fp32: a weak model with many near-tied answers (the
# small SQuAD default) can fail the metric gate with the default recipe and pass with more of it in fp32.
INT8_RECIPE_CHAIN = (DEFAULT_RECIPE, "rowwise-keep-ffn-emb8")


def matmul_roles(model_path: str | Path) -> dict[str, list[str]]:
    """The weight MatMul nodes of a plain exported graph by role: "L<i> qkv|attn_out|ffn_in|ffn_out", "head"."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    roles: dict[str, list[str]] = {}
    for node in graph.node:
        if node.op_type != "MatMul" or not any(name in weights for name in node.input):
            continue
        match = _LAYER_MATMUL.search(node.name)
        if match is None:
            role = "head"
        else:
            role = f"L{match.group(1)} " + ("qkv" if match.group(3) else _ROLES[match.group(2)])
        roles.setdefault(role, []).append(node.name)
    return roles


def _kept_nodes(model_path: str | Path, keep: tuple[str, ...]) -> list[str]:
    roles = matmul_roles(model_path)
    layers = sorted({int(r.split()[0][1:]) for r in roles if r != "head"})
    wanted = set()
    for item in keep:
        if item == "last_ffn_out" and layers:
            wanted.add(f"L{layers[-1]} ffn_out")
        elif item == "head" or " " in item:  # the head, or one layer's group: "L0 ffn_out"
            wanted.add(item)
        else:  # a role in every layer, e.g. "ffn_out"
            wanted |= {f"L{i} {item}" for i in layers}
    return [name for role in sorted(wanted) for name in roles.get(role, [])]


def to_int8(
    source: str | Path, target: str | Path, recipe: str = DEFAULT_RECIPE,
    calibration_feeds: list[dict[str, Any]] | None = None,
) -> Path:
    """int8 quantization of `source` (a plain exported graph) with one of `RECIPES`, for the CPU provider.

    Static recipes need `calibration_feeds` (padded batches of real training inputs).
    """
    chosen = RECIPES[recipe]
    if chosen.static and not calibration_feeds:
        raise ValueError(f"int8 recipe {recipe!r} is static: it needs calibration batches")

    with _quiet_quantizer():
        if chosen.static:
            _quantize_static(source, target, chosen, calibration_feeds or [])
        else:
            _quantize_dynamic(source, target, chosen, exclude=_kept_nodes(source, chosen.keep_fp32))
            if chosen.activation_scales == "row":
                from export.rowwise_quant import rowwise_activations

                rowwise_activations(target, target)
    if chosen.word_embeddings == "uint8":
        from export.embedding_quant import quantize_word_embeddings

        quantize_word_embeddings(target, target)
    return Path(target)


def quantize_dynamic_nodes(source: str | Path, target: str | Path, nodes: list[str],
                           op_types: tuple[str, ...] = ("MatMul",)) -> Path:
    """Dynamic int8 (the `dynamic` recipe) of only `nodes`: to measure each one's share of the drift."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet_quantizer():
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                         op_types_to_quantize=list(op_types), nodes_to_quantize=nodes,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return Path(target)


def embedding_gathers(model_path: str | Path) -> list[str]:
    """The Gather nodes that look up embedding tables (word, position, token type)."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    return [node.name for node in graph.node if node.op_type == "Gather" and node.input[0] in weights]


@contextmanager
def _quiet_quantizer() -> Iterator[None]:
    def chatter(record: logging.LogRecord) -> bool:
        # The quantizer logs a line per tensor at INFO, and generic pre-processing advice, on the root logger.
        return record.levelno >= logging.WARNING and "pre-processing before quantization" not in record.getMessage()

    logging.getLogger().addFilter(chatter)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(chatter)


def _quantize_dynamic(source: str | Path, target: str | Path, recipe: Int8Recipe, exclude: list[str]) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(source),
        str(target),
        weight_type=getattr(QuantType, recipe.weight_type),
        per_channel=True,
        reduce_range=recipe.reduce_range,
        op_types_to_quantize=list(recipe.op_types) if recipe.op_types else None,
        nodes_to_exclude=exclude,
        # Needed for graphs holding the optimizer's fused ops, whose output types the quantizer
        # cannot infer; harmless on a plain graph.
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def _quantize_static(source: str | Path, target: str | Path, recipe: Int8Recipe, feeds: list[dict[str, Any]]) -> None:
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from export.calibration import FeedReader

    quantize_static(
        str(source),
        str(target),
        FeedReader(feeds),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul"],
        per_channel=True,
        reduce_range=recipe.reduce_range,
        activation_type=QuantType.QUInt8,
        weight_type=getattr(QuantType, recipe.weight_type),
        nodes_to_exclude=_kept_nodes(source, recipe.keep_fp32),
        calibrate_method=getattr(CalibrationMethod, recipe.calibrate_method),
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True,
                       "ActivationSymmetric": recipe.activation_symmetric},
    )
