"""Batch-invariant dynamic int8: one activation scale per row (token) instead of one per batch tensor.

ONNX Runtime's dynamic quantization (`DynamicQuantizeLinear`) picks one scale and zero point for the whole
activation tensor of a pass, so an item's int8 answer moves with whatever else is in its batch (and with the
padding its neighbours bring). This rewrite of a `quantize_dynamic` graph replaces each `DynamicQuantizeLinear`
with a symmetric quantization along the last axis: every token row `x` gets `scale = max|x| / 127` and
`q = round(x / scale) + 128` (uint8 with the constant zero point 128, so `MatMulInteger` keeps its fast
u8 x s8 kernels and its scalar zero point). The int32 products are exact, and the float steps are elementwise per
row, so a row's result is the same whatever rows share its tensor. The output scaling becomes
`float(int32) * weight_scale * row_scale` (two elementwise products instead of one product of two scalars), which
also keeps ONNX Runtime from fusing it into `MatMulIntegerToFloat`: that kernel takes one scale per tensor and
would read only the first row's.

Ranges: row codes span 1..255 around 128 (7 bits and a sign), weights keep the recipe's range (`reduce_range`
s8: 7 bits), so the u8 x s8 pair sums of AVX2 kernels without VNNI (2 x 255 x 63) stay inside int16.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# Below this row maximum a row is treated as zero (its codes all 128): keeps the scale finite.
MIN_ROW_MAX = 1e-6
ZERO_POINT = 128
_CONSTANTS = {"rowq_min_max": np.array(MIN_ROW_MAX, np.float32), "rowq_127": np.array(127.0, np.float32),
              "rowq_one": np.array(1.0, np.float32), "rowq_zero_point": np.array(ZERO_POINT, np.uint8)}


class RowwiseError(RuntimeError):
    """The graph is not the one `quantize_dynamic` writes (a pattern the rewrite does not know)."""


def rowwise_activations(source: str | Path, target: str | Path) -> int:
    """Rewrite the dynamic int8 graph `source` to per-row activation scales, into `target`; the number of
    activation quantizers replaced."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    producers = {output: node for node in graph.node for output in node.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    replaced, nodes, scale_products = 0, [], set()
    for node in graph.node:
        if node.op_type == "DynamicQuantizeLinear":
            nodes += _row_quantizer(helper, node)
            replaced += 1
        elif _is_output_scaling(node, producers):
            product = producers[node.input[1]]
            scale_products.add(product.name)
            row_scale, weight_scale = product.input
            if producers.get(row_scale, node).op_type != "DynamicQuantizeLinear":
                row_scale, weight_scale = weight_scale, row_scale
            weighted = node.name + "_weight_scaled"
            nodes.append(helper.make_node("Mul", [node.input[0], weight_scale], [weighted], name=weighted))
            nodes.append(helper.make_node("Mul", [weighted, row_scale], list(node.output), name=node.name))
        else:
            nodes.append(node)
    if not replaced:
        raise RowwiseError(f"{source}: no DynamicQuantizeLinear to rewrite")
    # The scale products now unused (every reader was an output scaling, rewritten above).
    unused = {name for name in scale_products
              if all(_is_output_scaling(c, producers) for c in consumers.get(_output_of(name, graph), []))}
    kept = [node for node in nodes if node.name not in unused]
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in _CONSTANTS.items())
    onnx.checker.check_model(model)
    onnx.save(model, str(target))
    return replaced


def _output_of(node_name: str, graph) -> str:
    return next(node.output[0] for node in graph.node if node.name == node_name)


def _is_output_scaling(node, producers) -> bool:
    """`Mul(Cast(MatMulInteger(..)), Mul(row_scale, weight_scale))`, as `quantize_dynamic` writes it."""
    if node.op_type != "Mul" or len(node.input) != 2:
        return False
    cast, product = producers.get(node.input[0]), producers.get(node.input[1])
    return (cast is not None and cast.op_type == "Cast" and product is not None and product.op_type == "Mul"
            and producers.get(cast.input[0]) is not None and producers[cast.input[0]].op_type == "MatMulInteger")


def _row_quantizer(helper, node) -> list:
    """`q, scale, zero_point = DynamicQuantizeLinear(x)` as one symmetric scale per row of the last axis."""
    x = node.input[0]
    codes, scale, zero_point = node.output
    p = node.name + "_row"
    return [
        helper.make_node("Abs", [x], [p + "_abs"], name=p + "_abs"),
        helper.make_node("ReduceMax", [p + "_abs"], [p + "_max"], name=p + "_max", axes=[-1], keepdims=1),
        helper.make_node("Max", [p + "_max", "rowq_min_max"], [p + "_range"], name=p + "_range"),
        helper.make_node("Div", [p + "_range", "rowq_127"], [scale], name=p + "_scale"),
        helper.make_node("Div", ["rowq_127", p + "_range"], [p + "_inverse"], name=p + "_inverse"),
        helper.make_node("Mul", [x, p + "_inverse"], [p + "_scaled"], name=p + "_scaled"),
        # Round half to even, saturate to 0..255 and add the zero point in one op (scale 1 on the scaled row).
        helper.make_node("QuantizeLinear", [p + "_scaled", "rowq_one", "rowq_zero_point"], [codes], name=p + "_q"),
        helper.make_node("Identity", ["rowq_zero_point"], [zero_point], name=p + "_zero_point"),
    ]
