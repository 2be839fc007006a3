"""A layout graph's weights in `<file>.onnx_data`, copied from the model directory's external weights a chunk at a
time: a graph of any size is written without its weights ever being held in memory or in a protobuf. Optimum's two
decoders read theirs from the merged decoder's file (the same tensors), so the decoders' weights are on disk once."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx.external_data_helper import ExternalDataInfo

from ..artifacts.manifest import ModelDirError
from ..artifacts.model_dir import REMAKE
from ..core.files import contained_file

INLINE_MAX_BYTES = 1024  # smaller tensors (shapes, scalars, the rewrite's own constants) stay in the graph
CHUNK = 64 << 20
# A tensor from ALIGN_FROM bytes on starts at a multiple of ALIGN, as onnx's own writer places them: ONNX Runtime
# maps such a tensor from the file instead of reading it into memory of its own.
ALIGN, ALIGN_FROM = 64 << 10, 1 << 20


class WeightsFile:
    """One external data file being written, and where each tensor in it lies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.placed: dict[str, tuple[int, int]] = {}  # tensor name -> (offset, length)
        path.touch()

    def store(self, proto: onnx.ModelProto, source_dir: Path) -> None:
        """Every large tensor of `proto` into this file (those already in it by name are referred to, not copied);
        `source_dir`: where the graph's external references point."""
        with self.path.open("ab") as out:
            for tensor in proto.graph.initializer:
                if tensor.name not in self.placed and _size(tensor) > INLINE_MAX_BYTES:
                    if _size(tensor) >= ALIGN_FROM and out.tell() % ALIGN:
                        out.write(bytes(ALIGN - out.tell() % ALIGN))
                    self.placed[tensor.name] = (out.tell(), _size(tensor))
                    _copy(tensor, source_dir, out)
        self.refer(proto)

    def refer(self, proto: onnx.ModelProto) -> None:
        """`proto`'s tensors that this file holds read from it (by name: the same tensors)."""
        for tensor in proto.graph.initializer:
            if tensor.name in self.placed:
                offset, length = self.placed[tensor.name]
                tensor.ClearField("raw_data")
                del tensor.external_data[:]
                for key, value in (("location", self.path.name), ("offset", offset), ("length", length)):
                    tensor.external_data.add(key=key, value=str(value))
                tensor.data_location = onnx.TensorProto.EXTERNAL


def _size(tensor: onnx.TensorProto) -> int:
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return int(ExternalDataInfo(tensor).length or 0)
    return len(tensor.raw_data)


def _copy(tensor: onnx.TensorProto, source_dir: Path, out) -> None:
    """The tensor's bytes appended to `out`; an external one's read from its file, which must lie in the directory."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        out.write(tensor.raw_data)
        return
    info = ExternalDataInfo(tensor)
    path = contained_file(source_dir, info.location, ModelDirError, f"external weights of {tensor.name}", REMAKE)
    with path.open("rb") as source:
        source.seek(int(info.offset or 0))
        remaining = int(info.length or 0)
        while remaining:
            block = source.read(min(CHUNK, remaining))
            if not block:
                raise ModelDirError(f"{path}: ends before tensor {tensor.name}; {REMAKE}")
            out.write(block)
            remaining -= len(block)

