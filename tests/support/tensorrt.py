"""The TensorRT backend's own cache handling on the CPU, and what the real engine tests measure.

TensorRT cannot run here. TrtBackend is run with ONNX Runtime executing each graph call at the very addresses and
shapes the backend hands to TensorRT's `set_tensor_address`/`set_input_shape` (bound by pointer, on host memory):
its PingPong, views, gathers and limits are what is under test; the engines are covered by the GPU tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from support.backends import concat_backend
from support.common import DEMO_CKPT
from tfm_export.core.config import ModelConfig
from tfm_export.core.graph_spec import Graph, cache_names
from tfm_export.demo import numbers as demo_numbers
from tfm_export.runtime.backends.pingpong import ORT_TYPES, DeviceMemory
from tfm_export.runtime.backends.tensorrt import Bound, TrtBackend
from tfm_export.runtime.search import LoopSearcher
from tfm_export.runtime.translator import DecodeOptions, Translator

ENGINE_FLOORS = [("fp32", 0.995), ("fp16", 0.99), ("int8", 0.97)]  # greedy outputs identical to fp32 PyTorch


@dataclass(frozen=True)
class EngineDirStandIn:
    """What TrtBackend reads of an engine directory."""

    config: ModelConfig
    limits: dict[str, int]


class OrtEngines:
    """TensorRT's place taken by ONNX Runtime CPU sessions of the contract's graphs, run on the bound memory."""

    def __init__(self, sessions: dict[Graph, ort.InferenceSession]) -> None:
        self.sessions = sessions
        self.dtypes = {g: {t.name: ORT_TYPES[t.type] for t in (*s.get_inputs(), *s.get_outputs())}
                       for g, s in sessions.items()}
        self.calls: list[tuple[Graph, dict[str, tuple[int, ...]]]] = []

    def execute(self, graph: Graph, inputs: Bound, outputs: Bound) -> None:
        read = {address for address, shape in inputs.values() if np.prod(shape)}
        assert not any(address in read for address, _ in outputs.values()), "an output aliases an input"
        binding = self.sessions[graph].io_binding()
        for names, bind in ((inputs, binding.bind_input), (outputs, binding.bind_output)):
            for name, (address, shape) in names.items():
                bind(name, "cpu", 0, self.dtypes[graph][name].type, shape, address)
        self.sessions[graph].run_with_iobinding(binding)
        self.calls.append((graph, {name: shape for name, (_, shape) in inputs.items()}))


def cache_handling_backend(model_dir: Path, max_batch: int = 64) -> tuple[TrtBackend, Translator]:
    """TrtBackend over ONNX Runtime stand-in engines on host memory, and a Translator of the same directory's
    contract graphs to hold it to."""
    reference = concat_backend(model_dir)
    engines = OrtEngines({Graph.ENCODER: reference.encoder, Graph.DECODER_STEP: reference.decoder})
    limits = {"max_batch": max_batch, "max_source_length": 200, "max_target_length": 200}
    cache = engines.dtypes[Graph.DECODER_STEP][cache_names(reference.config).self_inputs[0]]
    memory = DeviceMemory("cpu", ["CPUExecutionProvider"], cache)
    backend = TrtBackend(EngineDirStandIn(reference.config, limits), engines, memory)
    loaded = Translator.load(model_dir)  # its vocabulary
    return backend, Translator(LoopSearcher(reference), loaded.vocab, loaded.config)


def greedy_agreement_with_pytorch(engines: Path, count: int) -> float:
    """The share of the first `count` held-out numbers that the engines translate exactly as fp32 PyTorch."""
    texts = [en for en, _ in demo_numbers.held_out_pairs()[:count]]
    want = [t.ids for t in Translator.load(DEMO_CKPT).translate(texts)]
    got = [t.ids for t in Translator.load(engines).translate(texts, DecodeOptions(batch_size=16))]
    return float(np.mean([g == w for g, w in zip(got, want, strict=True)]))
