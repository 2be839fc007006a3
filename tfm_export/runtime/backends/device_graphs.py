"""Two one-node ONNX graphs the device runtime runs on the cache buffers where Python cannot index memory (a GPU,
without PyTorch or CuPy): gathering rows (beam reorders, finished inputs leaving) and padding the positions axis
(a cache that grows). The runtime installs neither onnx nor PyTorch, so the graphs are written here in ONNX's
protobuf wire format directly: a handful of fields, checked against onnx's own serialisation by the tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

OPSET, IR_VERSION = 17, 8
ELEMENT_TYPES = {np.dtype(np.float32): 1, np.dtype(np.int32): 6, np.dtype(np.int64): 7,  # TensorProto's
                 np.dtype(np.float16): 10}
_VARINT, _LEN = 0, 2
_ATTR_INT = 2  # AttributeProto.INT


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 as protobuf writes negative numbers: ten bytes of two's complement
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, value: bytes | str | int) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3 | _VARINT) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | _LEN) + _varint(len(data)) + data


def _value_info(name: str, dtype: np.dtype, dims: Sequence[str]) -> bytes:
    """ValueInfoProto: a tensor of `dtype` whose axes are the named (dynamic) dims."""
    shape = _field(2, b"".join(_field(1, _field(2, d)) for d in dims))
    tensor = _field(1, ELEMENT_TYPES[np.dtype(dtype)]) + shape
    return _field(1, name) + _field(2, _field(1, tensor))


def _node(op: str, inputs: Sequence[str], outputs: Sequence[str], **ints: int) -> bytes:
    attributes = b"".join(_field(5, _field(1, key) + _field(20, _ATTR_INT) + _field(3, value))
                          for key, value in ints.items())
    return (b"".join(_field(1, i) for i in inputs) + b"".join(_field(2, o) for o in outputs)
            + _field(3, outputs[0]) + _field(4, op) + attributes)


def _model(name: str, nodes: list[bytes], inputs: list[bytes], outputs: list[bytes]) -> bytes:
    graph = (b"".join(_field(1, n) for n in nodes) + _field(2, name) + b"".join(_field(11, i) for i in inputs)
             + b"".join(_field(12, o) for o in outputs))
    return (_field(1, IR_VERSION) + _field(2, "tfm-export") + _field(7, graph)
            + _field(8, _field(1, "") + _field(2, OPSET)))


Tensor = tuple[np.dtype, int]  # an input's element type and rank


def _tensors(prefix: str, tensors: Sequence[Tensor], changed: int | None = None) -> list[bytes]:
    """ValueInfos prefix0..prefixn-1 with dims named per tensor and axis (`changed`: that axis gets its own name)."""
    return [_value_info(f"{prefix}{i}", dtype, [f"{prefix if a == changed else 'x'}{i}_{a}" for a in range(rank)])
            for i, (dtype, rank) in enumerate(tensors)]


def gather_model(tensors: Sequence[Tensor], axis: int = 1) -> bytes:
    """x0..xn-1 and rows (M,) int64 -> yi = Gather(xi, rows, axis): the rows of xi along `axis`."""
    return _model("gather_rows", [_node("Gather", [f"x{i}", "rows"], [f"y{i}"], axis=axis)
                                  for i in range(len(tensors))],
                  [*_tensors("x", tensors), _value_info("rows", np.int64, ["M"])], _tensors("y", tensors, axis))


def pad_model(tensors: Sequence[Tensor], axis: int) -> bytes:
    """x0..xn-1 and pads (2 x rank,) int64 -> yi = Pad(xi, pads): zeros in the new places along `axis`."""
    return _model("pad", [_node("Pad", [f"x{i}", "pads"], [f"y{i}"]) for i in range(len(tensors))],
                  [*_tensors("x", tensors), _value_info("pads", np.int64, ["P"])], _tensors("y", tensors, axis))
