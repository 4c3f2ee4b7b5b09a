"""A serialized ONNX model's large initializers as numpy arrays, read without the onnx package (the serving
install has none): a walk over the protobuf wire format of ModelProto.graph's `initializer` fields
(tasks/runtime/protobuf_wire.py reads the format; tasks/runtime/bundle.py walks it to find external data).

ONNX Runtime gives every session it creates from a model's bytes its own copy of the initializers. Sessions of
one model that pass these arrays, made into OrtValues once, to `SessionOptions.add_initializer` use the
caller's buffers instead: one copy for all of them (tasks/runtime/onnx_session.py, MemoryPolicy).
"""

from __future__ import annotations

import numpy as np

from tasks.runtime.protobuf_wire import WireError, next_field, varint

# TensorProto.DataType -> numpy (bfloat16 and the 8-bit floats have none: such tensors stay in the graph)
_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
           9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}
_MODEL_GRAPH = 7  # ModelProto.graph
_GRAPH_INITIALIZER = 5  # GraphProto.initializer
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_NAME, _TENSOR_RAW, _TENSOR_LOCATION = 1, 2, 8, 9, 14


class NotSplittable(WireError):
    """The bytes are not a model whose initializers can be read as expected."""


def large_initializers(data: bytes, min_bytes: int = 1024) -> dict[str, np.ndarray]:
    """The graph initializers of `data` stored as raw_data of a known type and at least `min_bytes`, by name
    (owned arrays, not views of `data`). Raises WireError (NotSplittable) when the bytes cannot be read as expected."""
    graph_start, graph_end = _find_field(data, 0, len(data), _MODEL_GRAPH)
    weights: dict[str, np.ndarray] = {}
    pos = graph_start
    while pos < graph_end:
        number, wire, pos, value_start, value_end = next_field(data, pos, graph_end)
        if number == _GRAPH_INITIALIZER and wire == 2:
            tensor = _tensor(data, value_start, value_end)
            if tensor is not None and tensor[1].nbytes >= min_bytes and tensor[0] not in weights:
                weights[tensor[0]] = tensor[1]
    return weights


def _tensor(data: bytes, start: int, end: int) -> tuple[str, np.ndarray] | None:
    """(name, values) of a TensorProto kept as raw_data of a known type; None for any other tensor."""
    dims: list[int] = []
    dtype = name = raw = None
    external = False
    pos = start
    while pos < end:
        number, wire, pos, value_start, value_end = next_field(data, pos, end)
        if number == _TENSOR_DIMS:
            if wire == 0:
                dims.append(varint(data, value_start, value_end)[0])
            else:  # packed
                inner = value_start
                while inner < value_end:
                    dim, inner = varint(data, inner, value_end)
                    dims.append(dim)
        elif number == _TENSOR_TYPE and wire == 0:
            dtype = _DTYPES.get(varint(data, value_start, value_end)[0])
        elif number == _TENSOR_NAME and wire == 2:
            name = data[value_start:value_end].decode("utf-8")
        elif number == _TENSOR_RAW and wire == 2:
            raw = (value_start, value_end)
        elif number == _TENSOR_LOCATION and wire == 0:
            external = varint(data, value_start, value_end)[0] != 0
    if dtype is None or not name or raw is None or external:
        return None
    count = int(np.prod(dims)) if dims else 1
    size = (raw[1] - raw[0]) // np.dtype(dtype).itemsize
    array = np.frombuffer(data, dtype=dtype, count=size, offset=raw[0])
    if array.size != count:
        return None
    return name, array.reshape(dims).copy()  # little-endian raw_data, as ONNX stores it; owned


def _find_field(data: bytes, start: int, end: int, wanted: int) -> tuple[int, int]:
    """(value start, value end) of the only length-delimited field `wanted` of a message."""
    found = None
    pos = start
    while pos < end:
        number, wire, pos, value_start, value_end = next_field(data, pos, end)
        if number == wanted and wire == 2:
            if found is not None:
                raise NotSplittable(f"field {wanted} appears twice")
            found = (value_start, value_end)
    if found is None:
        raise NotSplittable(f"no field {wanted}")
    return found
