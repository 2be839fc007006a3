"""The TensorRT backend: the engines of `tfm-export trt` behind the same encode/step/reorder interface.

TensorRT and TensorRT-RTX engines run alike (the same runtime API); the engine manifest names the library.

Every tensor is a torch CUDA tensor whose address goes to `set_tensor_address`, and the engines run
with `execute_async_v3` on the backend's own CUDA stream (current while it works), so TensorRT and the
cache gathers stay ordered without host synchronisation; only the logits come back to the host. The decoder
cache lives in two flat device buffers per tensor (ping-pong): a step reads the past from one and
writes the present into the other, and a beam reorder gathers back the other way, so the cache is
never allocated per step and never leaves the GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts.engine_dir import RTX, engine_target, plan_path, read_engine_manifest
from ..core.config import ModelConfig
from ..core.errors import InputTextError, TfmExportError
from ..core.graph_spec import Graph, cache_head_sizes, cache_names
from ..core.sources import check_source_length, check_target_length
from .cache import CacheState
from .tensorrt_platform import check_gpu_supported, current_platform, engine_mismatch, import_tensorrt

ENGINE_SOURCE_LIMIT = "the engines' profile (--max-source-length)"
ENGINE_TARGET_LIMIT = "the engines' profile: rebuild with a larger --max-target-length"


def _on_stream(method: Callable) -> Callable:
    """Run a backend method with the backend's own CUDA stream current, so TensorRT, the cache gathers and
    the copies are ordered on it; the logits' copy to the host is the only synchronisation."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.torch.cuda.stream(self.stream):
            return method(self, *args, **kwargs)
    return run


@dataclass
class _PingPong:
    """Two flat buffers for one cache tensor; views of the first rows x length elements are contiguous."""

    buffers: tuple[Any, Any]
    row_size: int  # n_head * d per position

    def view(self, side: int, rows: int, heads: int, length: int):
        flat = self.buffers[side][: rows * self.row_size * length]
        return flat.view(rows, heads, length, self.row_size // heads)  # (N, nh, L, d)


class TrtBackend:
    """decoding.StepBackend on an engine directory."""

    def __init__(self, directory: Path) -> None:
        manifest = read_engine_manifest(directory)
        plans = {g: plan_path(directory, manifest, g) for g in Graph}  # a damaged directory is refused anywhere
        target = engine_target(manifest)
        here = current_platform(target)
        check_gpu_supported(here)
        problem = engine_mismatch(manifest["tensorrt"], here)
        if problem:
            rebuild = " --target rtx" if target == RTX else ""
            raise TfmExportError(f"{directory}: engines {problem}; rebuild them here with `tfm-export trt{rebuild}`")
        import torch
        trt = import_tensorrt(target)
        runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
        self.engines = {g: self._load(trt, runtime, path, here.library) for g, path in plans.items()}
        self.contexts = {g: e.create_execution_context() for g, e in self.engines.items()}
        dtypes = {g: {name: _torch_dtype(trt, torch, e.get_tensor_dtype(name)) for name in _names(e)}
                  for g, e in self.engines.items()}
        # TensorRT on the legacy default stream synchronises every enqueue: the backend has a stream of its own
        self._setup(manifest, dtypes, torch.device("cuda"), torch.cuda.Stream())

    def _setup(self, manifest: dict[str, Any], dtypes: dict[Graph, dict[str, Any]], device: Any, stream: Any) -> None:
        """Everything but the engines: tensor names and dtypes, limits, the (empty) ping-pong cache."""
        import torch
        self.torch, self.manifest, self.dtypes, self.device, self.stream = torch, manifest, dtypes, device, stream
        self.config = ModelConfig.from_dict(manifest["model"])
        self.limits = manifest["limits"]
        self.names = cache_names(self.config)
        self._check_cache_dtypes()
        self._cache: list[_PingPong] = []
        self._side = 0
        self.step_calls = 0

    @staticmethod
    def _load(trt, runtime, path: Path, library: str):
        engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if engine is None:
            raise TfmExportError(f"{path}: {library} cannot load this engine (damaged, built by another version or "
                                 "library, or for another GPU?); rebuild it here with `tfm-export trt`")
        return engine

    def _execute(self, graph: Graph, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        context = self.contexts[graph]
        ok = all([context.set_input_shape(name, tuple(t.shape)) for name, t in inputs.items()])
        ok &= all([context.set_tensor_address(name, _address(t)) for name, t in {**inputs, **outputs}.items()])
        if not ok or not context.execute_async_v3(self.stream.cuda_stream):
            raise TfmExportError(f"TensorRT failed to run {graph.value} (shapes outside the engine's profile?)")

    def _check_cache_dtypes(self) -> None:
        """Every cache tensor, both graphs, one dtype: the ping-pong buffers are typed once."""
        step, enc = self.dtypes[Graph.DECODER_STEP], self.dtypes[Graph.ENCODER]
        found = {*(step[n] for n in (*self.names.self_inputs, *self.names.self_outputs, *self.names.cross_inputs)),
                 *(enc[n] for n in self.names.cross_outputs)}
        if len(found) != 1:
            raise TfmExportError(f"engine cache tensors mix dtypes {sorted(map(str, found))}; rebuild the engines "
                                 "from one tfm-export model directory")

    def _ids(self, graph: Graph, name: str, ids: np.ndarray):
        """int64 ids as the engine takes them (int64 on TensorRT 10+, int32 where the parser narrowed them)."""
        return self.torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(self.device,
                                                                                   self.dtypes[graph][name])

    def _ensure_cache(self, rows: int) -> None:
        """Ping-pong buffers big enough for `rows` rows at the engines' longest target."""
        cfg, length = self.config, self.limits["max_target_length"]
        sizes = [cfg.n_head * d for d in cache_head_sizes(cfg)]
        if self._cache and self._cache[0].buffers[0].numel() >= rows * sizes[0] * length:
            return
        dtype = self.dtypes[Graph.DECODER_STEP][self.names.self_inputs[0]]
        self._cache = [_PingPong(tuple(self.torch.empty(rows * s * length, dtype=dtype, device=self.device)
                                       for _ in range(2)), s) for s in sizes]

    def _past(self, side: int, rows: int, length: int) -> tuple[Any, ...]:
        return tuple(p.view(side, rows, self.config.n_head, length) for p in self._cache)

    @_on_stream
    def encode(self, src: np.ndarray) -> CacheState:
        cfg, (n, s) = self.config, src.shape
        check_source_length(s, self.limits["max_source_length"], ENGINE_SOURCE_LIMIT,
                            "shorten it, or rebuild the engines with a larger --max-source-length")
        self._check_rows(n)
        mask = self._ids(Graph.ENCODER, "attention_mask", (src != self.config.src_pad_idx).astype(np.int64))
        out = {"last_hidden_state": self._empty(Graph.ENCODER, "last_hidden_state", n, s, cfg.d_model)}
        for name, d in zip(self.names.cross_outputs, cache_head_sizes(cfg), strict=True):
            out[name] = self._empty(Graph.ENCODER, name, n, cfg.n_head, s, d)
        self._execute(Graph.ENCODER, {"input_ids": self._ids(Graph.ENCODER, "input_ids", src),
                                      "attention_mask": mask}, out)
        self._ensure_cache(n)
        step_mask = mask.to(self.dtypes[Graph.DECODER_STEP]["encoder_attention_mask"])
        cross = tuple(out[name] for name in self.names.cross_outputs)
        return CacheState(step_mask, cross, self._past(self._side, n, 0))

    def _empty(self, graph: Graph, name: str, *shape: int):
        return self.torch.empty(shape, dtype=self.dtypes[graph][name], device=self.device)

    def _check_rows(self, rows: int) -> None:
        if rows > self.limits["max_batch"]:
            raise InputTextError(f"{rows} rows (batch x beam) exceed the engines' --max-batch "
                                 f"{self.limits['max_batch']}; lower --batch-size or --beam-size, or rebuild with a "
                                 "larger --max-batch")

    @_on_stream
    def step(self, state: CacheState, tokens: np.ndarray) -> tuple[CacheState, np.ndarray]:
        n, past = len(tokens), state.past_length
        check_target_length(past + 1, self.limits["max_target_length"], ENGINE_TARGET_LIMIT)
        graph, other = Graph.DECODER_STEP, 1 - self._side
        present = self._past(other, n, past + 1)
        logits = self._empty(graph, "logits", n, 1, self.config.trg_vocab_size)
        inputs = {"input_ids": self._ids(graph, "input_ids", tokens[:, None]), "encoder_attention_mask": state.mask,
                  **dict(zip(self.names.self_inputs, state.past, strict=True)),
                  **dict(zip(self.names.cross_inputs, state.cross, strict=True))}
        self._execute(graph, inputs, {"logits": logits, **dict(zip(self.names.self_outputs, present, strict=True))})
        self._side = other
        self.step_calls += 1
        return CacheState(state.mask, state.cross, present), logits[:, -1].float().cpu().numpy()

    @_on_stream
    def reorder(self, state: CacheState, rows: np.ndarray, same_sources: bool = False) -> CacheState:
        self._check_rows(len(rows))
        index = self.torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)
        if state.past_length == 0:  # beam search widens the batch right after encoding: nothing cached yet
            self._ensure_cache(len(rows))
            past = self._past(self._side, len(rows), 0)
        else:
            other = 1 - self._side
            past = self._past(other, len(rows), state.past_length)
            for source, target in zip(state.past, past, strict=True):
                self.torch.index_select(source, 0, index, out=target)
            self._side = other
        if same_sources:
            return CacheState(state.mask, state.cross, past)
        pick = lambda ts: tuple(t.index_select(0, index) for t in ts)  # noqa: E731
        return CacheState(state.mask.index_select(0, index), pick(state.cross), past)


def _address(tensor) -> int:
    """A device address for TensorRT. An empty tensor (the past at the first step) has data_ptr() 0, which
    TensorRT refuses even for zero bytes; its buffer's own address is non-null and distinct per buffer."""
    return tensor.data_ptr() if tensor.numel() else tensor.untyped_storage().data_ptr()


def _names(engine) -> list[str]:
    return [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]


def _torch_dtype(trt, torch, dtype):
    table = {trt.float32: torch.float32, trt.float16: torch.float16, trt.int32: torch.int32, trt.bool: torch.bool}
    if hasattr(trt, "int64"):
        table[trt.int64] = torch.int64
    if dtype not in table:
        raise TfmExportError(f"engine tensor type {dtype} is not one this runtime feeds; rebuild from tfm-export "
                             "graphs")
    return table[dtype]
