"""The TensorRT backend: the engines of `tfm-export trt` behind the step interface, without PyTorch.

TensorRT and TensorRT-RTX engines run alike (the same runtime API); the engine manifest names the library. Every
tensor lives in ONNX Runtime's CUDA memory (OrtValues, whose addresses go to `set_tensor_address`), gathers run as
one-node ONNX Runtime graphs on the device (runtime.backends.pingpong), and the engines run with
`execute_async_v3` on a CUDA stream of their own (from cuda-python; the default stream where it is missing). The
decoder cache is a PingPong laid out at the current length: a step reads the past from one set and writes the grown
present into the other (TensorRT 8.6 has no in-place cache), a beam reorder gathers back the other way, so the
cache is allocated once per decode and never leaves the GPU; only the logits come to the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from ...artifacts.engine_dir import RTX, EngineDir
from ...core.errors import InputTextError, TfmExportError
from ...core.graph_spec import (
    ATTENTION_MASK,
    CONTRACT_GRAPHS,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LAST_HIDDEN_STATE,
    LOGITS,
    Graph,
    cache_head_sizes,
    cache_names,
)
from ...core.sources import check_source_length, check_target_length
from ..counts import WorkCounts
from ..session import CUDA_PROVIDER
from ..step import Candidates, Reorders, StepRule
from ..tensorrt_platform import check_gpu_supported, cuda_stream, current_platform, engine_mismatch, import_tensorrt
from .pingpong import DeviceMemory, PingPong

ENGINE_SOURCE_LIMIT = "the engines' profile (--max-source-length)"
ENGINE_TARGET_LIMIT = "the engines' profile: rebuild with a larger --max-target-length"
Bound = dict[str, tuple[int, tuple[int, ...]]]  # tensor name -> (device address, shape)


class Engines(Protocol):
    """What the backend asks of the engines: each tensor's dtype, and one run of a graph on bound memory."""

    dtypes: dict[Graph, dict[str, np.dtype]]

    def execute(self, graph: Graph, inputs: Bound, outputs: Bound) -> None: ...


class TensorRTEngines:
    """An engine directory's plans, deserialised, one execution context each, run on one CUDA stream."""

    def __init__(self, engine_dir: EngineDir) -> None:
        plans = {g: engine_dir.plan_path(g) for g in CONTRACT_GRAPHS}  # a damaged directory is refused anywhere
        here = current_platform(engine_dir.target)
        check_gpu_supported(here)
        problem = engine_mismatch(engine_dir.manifest.tensorrt, here)
        if problem:
            rebuild = " --target rtx" if engine_dir.target == RTX else ""
            raise TfmExportError(f"{engine_dir.path}: engines {problem}; rebuild them here with "
                                 f"`tfm-export trt{rebuild}`")
        trt = import_tensorrt(engine_dir.target)
        runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
        engines = {g: _load(runtime, path, here.library) for g, path in plans.items()}
        self.contexts = {g: e.create_execution_context() for g, e in engines.items()}
        self.dtypes = {g: {name: np.dtype(trt.nptype(e.get_tensor_dtype(name))) for name in _names(e)}
                       for g, e in engines.items()}
        self.stream = cuda_stream()  # TensorRT on the legacy default stream synchronises every enqueue

    def execute(self, graph: Graph, inputs: Bound, outputs: Bound) -> None:
        context = self.contexts[graph]
        ok = all([context.set_input_shape(name, shape) for name, (_, shape) in inputs.items()])
        ok &= all([context.set_tensor_address(name, address) for name, (address, _) in {**inputs, **outputs}.items()])
        if not ok or not context.execute_async_v3(self.stream):
            raise TfmExportError(f"TensorRT failed to run {graph.value} (shapes outside the engine's profile?)")


def _load(runtime: Any, path: Any, library: str) -> Any:
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise TfmExportError(f"{path}: {library} cannot load this engine (damaged, built by another version or "
                             "library, or for another GPU?); rebuild it here with `tfm-export trt`")
    return engine


def _names(engine: Any) -> list[str]:
    return [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]


@dataclass
class TrtState:
    """A decode's state: per-row source mask and cross keys/values, and the cache PingPong, whose current set
    holds the `length` filled positions. Steps and reorders update it in place."""

    mask: ort.OrtValue
    cross: tuple[ort.OrtValue, ...]
    cache: PingPong
    length: int = 0
    io: dict[str, ort.OrtValue] = field(default_factory=dict)  # the step's ids and logits, for the current rows

    @property
    def rows(self) -> int:
        return self.cache.rows


class TrtBackend(Reorders):
    """StepBackend on an engine directory's engines, with its memory on their device."""

    def __init__(self, engine_dir: EngineDir, engines: Engines, memory: DeviceMemory) -> None:
        self.engine_dir, self.engines, self.memory = engine_dir, engines, memory
        self.config, self.limits = engine_dir.config, engine_dir.limits
        self.names, self.dtypes = cache_names(self.config), engines.dtypes
        self._check_cache_dtypes()
        self.counts: WorkCounts | None = None  # given by those who count work

    def _check_cache_dtypes(self) -> None:
        """Every cache tensor, both graphs, the memory's one dtype: the PingPong is typed once."""
        step, enc = self.dtypes[Graph.DECODER_STEP], self.dtypes[Graph.ENCODER]
        found = {*(step[n] for n in (*self.names.self_inputs, *self.names.self_outputs, *self.names.cross_inputs)),
                 *(enc[n] for n in self.names.cross_outputs)}
        if found != {self.memory.dtype}:
            raise TfmExportError(f"engine cache tensors are {sorted(map(str, found))}, not one dtype; rebuild the "
                                 "engines from one tfm-export model directory")

    def _array(self, graph: Graph, name: str, values: np.ndarray) -> ort.OrtValue:
        """Host values in device memory, as the engine takes them (ids int64 on TensorRT 10+, int32 where the
        parser narrowed them)."""
        return self.memory.upload(np.ascontiguousarray(values, dtype=self.dtypes[graph][name]))

    def _empty(self, graph: Graph, name: str, *shape: int) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_shape_and_type(shape, self.dtypes[graph][name].type, self.memory.device, 0)

    def _cache(self, rows: int) -> PingPong:
        """A PingPong for `rows` rows at the engines' longest target, allocated once per decode."""
        cfg = self.config
        return PingPong.allocate(self.memory, rows, cfg.n_layers, cfg.n_head, (cfg.d_k, cfg.d_v),
                                 self.limits["max_target_length"])

    def encode(self, src: np.ndarray) -> TrtState:
        cfg, (n, s) = self.config, src.shape
        check_source_length(s, self.limits["max_source_length"], ENGINE_SOURCE_LIMIT,
                            "shorten it, or rebuild the engines with a larger --max-source-length")
        self._check_rows(n)
        mask = (src != cfg.src_pad_idx).astype(np.int64)
        feeds = {INPUT_IDS: self._array(Graph.ENCODER, INPUT_IDS, src),
                 ATTENTION_MASK: self._array(Graph.ENCODER, ATTENTION_MASK, mask)}
        out = {LAST_HIDDEN_STATE: self._empty(Graph.ENCODER, LAST_HIDDEN_STATE, n, s, cfg.d_model)}
        for name, d in zip(self.names.cross_outputs, cache_head_sizes(cfg), strict=True):
            out[name] = self._empty(Graph.ENCODER, name, n, cfg.n_head, s, d)
        self.engines.execute(Graph.ENCODER, _bound(feeds), _bound(out))
        step_mask = self._array(Graph.DECODER_STEP, ENCODER_ATTENTION_MASK, mask)
        return TrtState(step_mask, tuple(out[name] for name in self.names.cross_outputs), self._cache(n))

    def _check_rows(self, rows: int) -> None:
        if rows > self.limits["max_batch"]:
            raise InputTextError(f"{rows} rows (batch x beam) exceed the engines' --max-batch "
                                 f"{self.limits['max_batch']}; lower --batch-size or --beam-size, or rebuild with a "
                                 "larger --max-batch")

    def step(self, state: TrtState, tokens: np.ndarray, rule: StepRule) -> tuple[TrtState, Candidates]:
        n, past, graph = len(tokens), state.length, Graph.DECODER_STEP
        check_target_length(past + 1, self.limits["max_target_length"], ENGINE_TARGET_LIMIT)
        if state.io.get(LOGITS) is None or state.io[LOGITS].shape()[0] != n:
            state.io = {INPUT_IDS: self._empty(graph, INPUT_IDS, n, 1),
                        LOGITS: self._empty(graph, LOGITS, n, 1, self.config.trg_vocab_size)}
        state.io[INPUT_IDS].update_inplace(np.ascontiguousarray(tokens[:, None], self.dtypes[graph][INPUT_IDS]))
        cache = state.cache
        inputs = {**_bound({INPUT_IDS: state.io[INPUT_IDS], ENCODER_ATTENTION_MASK: state.mask}),
                  **dict(zip(self.names.self_inputs, cache.tensors(cache.current, past), strict=True)),
                  **_bound(dict(zip(self.names.cross_inputs, state.cross, strict=True)))}
        outputs = {**_bound({LOGITS: state.io[LOGITS]}),
                   **dict(zip(self.names.self_outputs, cache.tensors(1 - cache.current, past + 1), strict=True))}
        self.engines.execute(graph, inputs, outputs)
        cache.flip()
        state.length = past + 1
        if self.counts is not None:
            self.counts.run(state.rows)
        return state, rule.candidates(state.io[LOGITS].numpy()[:, -1].astype(np.float32))

    def select(self, state: TrtState, rows: np.ndarray) -> TrtState:
        """The kept rows' mask, cross keys/values and cache (into the other set, or a wider PingPong)."""
        rows = np.asarray(rows)
        self._check_rows(len(rows))
        state.cross, state.mask = self.memory.gather_sources(state.cross, state.mask, rows)
        if len(rows) > state.cache.rows:  # beam search widens the batch: a PingPong for the wider row set
            wider = self._cache(len(rows))
            state.cache.gather(rows, state.length, into=wider)
            state.cache = wider
        else:
            state.cache.gather(rows, state.length)
        return state

    def permute(self, state: TrtState, rows: np.ndarray) -> TrtState:
        state.cache.gather(np.asarray(rows), state.length)
        return state


def _bound(values: dict[str, ort.OrtValue]) -> Bound:
    return {name: (value.data_ptr(), tuple(value.shape())) for name, value in values.items()}


def open_engines(engine_dir: EngineDir) -> TrtBackend:
    """The engines on the GPU (what TensorRT needs is checked first), their memory ONNX Runtime's CUDA memory."""
    engines = TensorRTEngines(engine_dir)
    if CUDA_PROVIDER not in ort.get_available_providers():
        raise TfmExportError("the TensorRT backend keeps its buffers in ONNX Runtime's CUDA memory, and this "
                             "onnxruntime has no CUDAExecutionProvider; install onnxruntime-gpu (tfm-export[gpu])")
    cache = engines.dtypes[Graph.DECODER_STEP][cache_names(engine_dir.config).self_inputs[0]]
    return TrtBackend(engine_dir, engines, DeviceMemory("cuda", [CUDA_PROVIDER], cache))
