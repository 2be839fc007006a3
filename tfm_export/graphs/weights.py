"""The tensors behind an exported graph's initializers, kept as recipes over the model's own tensors until the
moment they are written, and written once each.

The exporter traces a graph without its weights (they are its trailing inputs, named by the model's parameter
names), so that no rewrite ever holds a copy of them: folding the transpose a Linear layer's MatMul reads, or
laying a layer's Q, K and V weights side by side, makes a new recipe, not a new array. `bind` then turns the
weight inputs into initializers: inline in the graph file, or in an external data file, which a `WeightFile`
writes tensor by tensor (transposes in blocks), each recipe once however many graphs read it. A 1.3B-parameter
model is exported this way holding its weights once, as the mapped checkpoint, plus one block being written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

ALIGNMENT = 4096  # external tensors start on a page: a runtime may map them
BLOCK_BYTES = 64 << 20  # a transposed tensor is copied and written this much at a time
INLINE_MAX_BYTES = 1024  # smaller initializers stay in the graph file whatever the layout (shapes, scalars)

Key = tuple  # what a weight is made of: equal keys, equal bytes


@dataclass(frozen=True)
class Weight:
    """One initializer's bytes, as a recipe: `make()` returns them as an array view where it can (a parameter's
    own memory, a transposed view), only ever when they are written."""

    key: Key
    dtype: np.dtype
    shape: tuple[int, ...]
    make: Callable[[], np.ndarray]

    @classmethod
    def of(cls, name: str, tensor: Any) -> Weight:
        """A model tensor (torch's: its memory, viewed), by its parameter name (the key: a tied table is one
        parameter under one name)."""
        array = tensor.detach().numpy()
        return cls(("tensor", name), array.dtype, array.shape, lambda: array)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def transposed(self) -> Weight:
        """The 2-D weight a MatMul reads where the model's Linear layer keeps its transpose."""
        return Weight(("T", self.key), self.dtype, self.shape[::-1], lambda: self.make().T)

    @staticmethod
    def concatenated(weights: list[Weight], axis: int) -> Weight:
        shape = list(weights[0].shape)
        shape[axis] = sum(w.shape[axis] for w in weights)
        return Weight(("concat", axis, tuple(w.key for w in weights)), weights[0].dtype, tuple(shape),
                      lambda: np.concatenate([w.make() for w in weights], axis=axis))

    def array(self) -> np.ndarray:
        return np.ascontiguousarray(self.make())


class WeightFile:
    """An external data file being written: each distinct weight once, aligned, its offset remembered so that every
    graph that reads it points there. Written in blocks, so that a transposed table never exists whole twice."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.placed: dict[Key, tuple[int, int]] = {}
        self._file = open(path, "wb")  # noqa: SIM115 (closed by close() after the last graph, or on leaving a with)
        self._digest = hashlib.sha256()  # of every byte written: the manifest's, without reading gigabytes again
        self.sha256: str | None = None  # once closed

    def place(self, weight: Weight) -> tuple[int, int]:
        """(offset, length) of the weight in the file, written now if it is not there yet."""
        if weight.key not in self.placed:
            self._put(bytes(-self._file.tell() % ALIGNMENT))
            offset = self._file.tell()
            self._write(weight.make())
            self.placed[weight.key] = (offset, self._file.tell() - offset)
        return self.placed[weight.key]

    def _write(self, array: np.ndarray) -> None:
        rows = max(1, BLOCK_BYTES // max(1, array[:1].nbytes)) if array.ndim else 1
        for start in range(0, max(1, len(array)) if array.ndim else 1, rows):
            self._put(memoryview(np.ascontiguousarray(array[start:start + rows] if array.ndim else array)).cast("B"))

    def _put(self, data: bytes | memoryview) -> None:
        self._file.write(data)
        self._digest.update(data)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
            self.sha256 = self._digest.hexdigest()

    def __enter__(self) -> WeightFile:
        return self

    def __exit__(self, *exc: object) -> None:
        """Closed on an error too: an open file on a full disk would keep it from being unmounted or freed."""
        self._file.close()

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def external_tensor(name: str, weight: Weight, file: WeightFile) -> onnx.TensorProto:
    offset, length = file.place(weight)
    tensor = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(weight.dtype),
                              dims=weight.shape, data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", file.path.name), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def bind(proto: onnx.ModelProto, weights: Mapping[str, Weight],
         external: Callable[[str, Weight], bool] = lambda name, weight: False, file: WeightFile | None = None) -> None:
    """The weight inputs become initializers: in `file` where `external(name, weight)` says so, inline otherwise.
    Weights no node reads any more are dropped."""
    graph = proto.graph
    read = {name for node in graph.node for name in node.input}
    for value in [v for v in graph.input if v.name in weights]:
        graph.input.remove(value)
    for name, weight in weights.items():
        if name not in read:
            continue
        if file is not None and external(name, weight):
            graph.initializer.append(external_tensor(name, weight, file))
        else:
            graph.initializer.append(numpy_helper.from_array(weight.array(), name))


def externalize(proto: onnx.ModelProto, file: WeightFile) -> None:
    """A loaded graph's initializers larger than INLINE_MAX_BYTES moved into `file`, each distinct tensor once by
    its bytes (two graphs quantized from the same weights hold the same int8 tensors: stored once)."""
    graph = proto.graph
    for index, init in enumerate(graph.initializer):
        if init.data_location == onnx.TensorProto.EXTERNAL:
            continue
        array = numpy_helper.to_array(init)
        if array.nbytes <= INLINE_MAX_BYTES:
            continue
        digest = hashlib.sha1(memoryview(np.ascontiguousarray(array)).cast("B")).hexdigest()
        weight = Weight(("bytes", array.dtype.str, array.shape, digest), array.dtype, array.shape,
                        lambda array=array: array)
        graph.initializer[index].CopyFrom(external_tensor(init.name, weight, file))


def weight_inputs(proto: onnx.ModelProto, tensors: Mapping[str, Any]) -> dict[str, Weight]:
    """The traced graph's weight inputs (named by the model's parameter and buffer names), as recipes."""
    return {v.name: Weight.of(v.name, tensors[v.name]) for v in proto.graph.input if v.name in tensors}


def fold_transposes(proto: onnx.ModelProto, weights: dict[str, Weight], keep_gathered: bool) -> None:
    """Transpose(W) of a 2-D weight becomes the weight W^T. A table that Gathers also read (the tied embedding and
    output projection) is one tensor in the file either way: with `keep_gathered` the Transpose stays (ONNX Runtime
    folds it when a session opens, and the graph holds the very table the encoder does: runtime sharing); without,
    W^T is stored and the Gathers read it along axis 1 (`gather_from_transposed`)."""
    graph = proto.graph
    gathered_tables = {n.input[0] for n in graph.node if n.op_type == "Gather"}
    renamed: dict[str, str] = {}  # a folded Transpose's output -> the weight it now is
    regathered: dict[str, str] = {}  # a table -> its W^T, which its Gathers are to read
    for node in [n for n in graph.node if n.op_type == "Transpose" and n.input[0] in weights]:
        weight = weights[node.input[0]]
        perm = [a.ints for a in node.attribute if a.name == "perm"]
        gathered = node.input[0] in gathered_tables
        if len(weight.shape) != 2 or (perm and list(perm[0]) != [1, 0]) or (gathered and keep_gathered):
            continue
        name = f"{node.input[0]}.T"
        if name not in weights:
            add_weight(proto, weights, name, weight.transposed())
        renamed[node.output[0]] = name
        if gathered:
            regathered[node.input[0]] = name
    if {o.name for o in graph.output} & renamed.keys():
        raise ValueError("a graph output is the transpose of a weight; it cannot be folded into one")
    kept = [n for n in graph.node if not (n.op_type == "Transpose" and n.output[0] in renamed)]
    for node in kept:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    del graph.node[:]
    graph.node.extend(kept)
    for table, transposed in regathered.items():
        gather_from_transposed(graph, table, transposed)
    drop_unread(proto, weights)


def gather_from_transposed(graph: onnx.GraphProto, weight: str, transposed: str) -> None:
    """Gather(W, ids) (..., C) == Transpose(Gather(W^T, ids, axis=1)) with the C axis moved last."""
    for node in [n for n in graph.node if n.op_type == "Gather" and n.input[0] == weight]:
        gathered = f"{node.output[0]}__from_{transposed}"
        new_gather = helper.make_node("Gather", [transposed, node.input[1]], [gathered], axis=1,
                                      name=f"{node.name}_transposed")
        rank = _rank_of(graph, node.input[1])  # Gather(W^T, ids of rank r, axis=1) -> (C, *ids.shape)
        move = helper.make_node("Transpose", [gathered], [node.output[0]], perm=[*range(1, rank + 1), 0],
                                name=f"{node.name}_channels_last")
        index = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(index, move)
        graph.node.insert(index, new_gather)


def _rank_of(graph: onnx.GraphProto, name: str) -> int:
    for value in [*graph.input, *graph.value_info]:
        if value.name == name:
            return len(value.type.tensor_type.shape.dim)
    raise ValueError(f"cannot tell the rank of {name} to rewrite its Gather")


def add_weight(proto: onnx.ModelProto, weights: dict[str, Weight], name: str, weight: Weight) -> None:
    """A new weight, a graph input until `bind` (so that shape inference and the optimizer see its shape)."""
    weights[name] = weight
    proto.graph.input.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(weight.dtype),
                                                           list(weight.shape)))


def drop_unread(proto: onnx.ModelProto, weights: dict[str, Weight]) -> None:
    """Weights no node reads any more (folded, merged), gone from the graph's inputs too."""
    read = {name for node in proto.graph.node for name in node.input}
    unread = [n for n in weights if n not in read]
    for name in unread:
        del weights[name]
    for value in [v for v in proto.graph.input if v.name in unread]:
        proto.graph.input.remove(value)
