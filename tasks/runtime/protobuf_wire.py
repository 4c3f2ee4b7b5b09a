"""The protobuf wire format read without a protobuf library: the varints and fields that tasks/runtime/bundle.py
(external data locations) and tasks/runtime/onnx_weights.py (initializers) walk in a serialized ONNX model, since the
serving install has no onnx package."""

from __future__ import annotations

from typing import Any


class WireError(ValueError):
    """Bytes that are not the protobuf message expected."""


def varint(data: Any, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the varint at `pos`."""
    result = shift = 0
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def next_field(data: Any, pos: int, end: int) -> tuple[int, int, int, int, int]:
    """(field number, wire type, position after the field, value start, value end) of the field at `pos`; a
    varint field's value is its encoded bytes, a length-delimited one's its payload."""
    key, pos = varint(data, pos, end)
    number, wire = key >> 3, key & 7
    if wire == 0:
        value_start = pos
        _, pos = varint(data, pos, end)
        return number, wire, pos, value_start, pos
    if wire == 2:
        length, pos = varint(data, pos, end)
        size = length
    elif wire in (1, 5):
        size = 8 if wire == 1 else 4
    else:
        raise WireError(f"wire type {wire} (not used by ONNX)")
    if pos + size > end:
        raise WireError("a field runs past its message")
    return number, wire, pos + size, pos, pos + size
