"""The bls layout: the runtime's ONNX Runtime backend (its encode/step/reorder and cache handling, under the one
decoding loop) with each graph call answered by a native Triton model through BLS instead of a local session.

`TritonGraph` offers the three things the backend asks of a session (`get_inputs`, `get_outputs`, `run`), so no
decoding or cache code is repeated here. On the CPU every tensor is a NumPy array. On the GPU the native models'
outputs are requested in GPU memory and kept there as torch tensors through DLPack (the cache is reordered on
the device); only the logits come to the host for the search.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts.engine_dir import EngineDir, is_engine_dir
from ..artifacts.model_dir import ModelDir
from ..core.errors import TfmExportError
from ..core.graph_spec import CONTRACT_GRAPHS, LOGITS, GraphSpec
from ..runtime.backends import CONCAT, open_backend
from ..runtime.session import SessionOptions
from ..runtime.translator import Translator
from .contract import NativeGraph, native_graphs

ORT_TYPES = {"float32": "float", "float16": "float16", "int64": "int64", "int32": "int32"}
HOST_OUTPUTS = (LOGITS,)  # what the search reads on the host; everything else may stay on the device


@dataclass(frozen=True)
class _Arg:
    """A graph input or output as an ONNX Runtime session describes it."""

    name: str
    type: str  # "tensor(float)", ...


class TritonGraph:
    """One native Triton model (encoder or decoder_step) behind an ONNX Runtime session's interface."""

    def __init__(self, pb_utils: Any, model: str, graph: NativeGraph, gpu: int | None = None) -> None:
        """gpu: the device to keep outputs on (None: host memory, NumPy)."""
        self.pb, self.model, self.gpu = pb_utils, model, gpu
        self.inputs = [_Arg(t.name, f"tensor({ORT_TYPES[t.dtype]})") for t in graph.inputs]
        self.outputs = [_Arg(t.name, f"tensor({ORT_TYPES[t.dtype]})") for t in graph.outputs]
        self.dtypes = {t.name: np.dtype(t.dtype) for t in graph.inputs}

    def get_inputs(self) -> list[_Arg]:
        return self.inputs

    def get_outputs(self) -> list[_Arg]:
        return self.outputs

    def run(self, names: list[str], feeds: dict[str, Any]) -> list[Any]:
        memory = {} if self.gpu is None else {
            "preferred_memory": self.pb.PreferredMemory(self.pb.TRITONSERVER_MEMORY_GPU, self.gpu)}
        request = self.pb.InferenceRequest(model_name=self.model, requested_output_names=list(names),
                                           inputs=[self._tensor(n, v) for n, v in feeds.items()], **memory)
        response = request.exec()
        if response.has_error():
            raise TfmExportError(f"Triton model {self.model}: {response.error().message()}")
        return [self._array(self.pb.get_output_tensor_by_name(response, n), n in HOST_OUTPUTS) for n in names]

    def _tensor(self, name: str, value: Any) -> Any:
        """NumPy arrays go as they are (ids in the dtype the model takes); device tensors by DLPack, no copy."""
        if isinstance(value, np.ndarray):
            return self.pb.Tensor(name, np.ascontiguousarray(value, dtype=self.dtypes[name]))
        from torch.utils.dlpack import to_dlpack  # GPU only: the cache is a torch tensor there
        return self.pb.Tensor.from_dlpack(name, to_dlpack(value.contiguous()))

    @staticmethod
    def _array(tensor: Any, host: bool) -> Any:
        """A copy we own (the response's memory goes with it): NumPy on the host, else a torch device tensor."""
        if tensor.is_cpu():
            return np.array(tensor.as_numpy())
        from torch.utils.dlpack import from_dlpack
        device = from_dlpack(tensor.to_dlpack())
        return device.cpu().numpy() if host else device.clone()


def bls_translator(directory: Path, parameters: dict[str, str], pb_utils: Any, gpu: int | None) -> Translator:
    """The model directory's Translator (as `tfm-run` builds it) whose backend runs the decoding loop over the
    repository's native models: opened through the runtime's one door, with a session loader that answers each
    graph by its native Triton model."""
    source = EngineDir.read(directory) if is_engine_dir(directory) else ModelDir.read(directory)
    graphs = native_graphs(source)
    names = {g.filename: parameters[f"{g.value}_model"] for g in CONTRACT_GRAPHS}

    def load(path: Path, spec: GraphSpec, options: SessionOptions, so: Any) -> TritonGraph:
        return TritonGraph(pb_utils, names[path.name], graphs[spec.graph], gpu)
    return Translator.of(open_backend(directory, CONCAT, loader=load))
