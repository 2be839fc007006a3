"""The ONNX Runtime backend: encoder once, decoder_step per token, the KV cache fed back as NumPy arrays."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..artifacts.manifest import ModelDirError
from ..artifacts.model_dir import ModelDir
from ..core.config import ModelConfig
from ..core.graph_spec import Graph, GraphSpec, cache_head_sizes, cache_names, graph_specs
from ..core.sources import check_source_length, check_target_length
from .cache import CacheState
from .decoding import Candidates, StepRule
from .session import DEFAULT_OPTIONS, SessionOptions, open_session, run


def check_contract_tensors(session: ort.InferenceSession, spec: GraphSpec, path: Path) -> ort.InferenceSession:
    """A graph whose inputs/outputs (names, ranks, fixed sizes) are not the ones the manifest's model config
    implies (a graph of another model put in the directory, an edited config) is refused here, not met as a
    KeyError or an ONNX Runtime shape error mid-decode."""
    for kind, got, want in (("inputs", session.get_inputs(), spec.inputs), ("outputs", session.get_outputs(),
                                                                             spec.outputs)):
        names, expected = [v.name for v in got], [t.name for t in want]
        ranks, expected_ranks = [len(v.shape) for v in got], [len(t.shape) for t in want]
        if names != expected or ranks != expected_ranks:
            raise ModelDirError(f"{path}: its {kind} do not match the graph contract for this manifest's model "
                                f"(got {len(names)}, expected {len(expected)}: {_first_difference(names, expected)}); "
                                "export the model again")
        for value, tensor in zip(got, want, strict=True):  # fixed sizes (heads, head size) as the config says
            sizes = [(g, w) for g, w in zip(value.shape, tensor.shape, strict=True)
                     if isinstance(g, int) and isinstance(w, int) and g != w]
            if sizes:
                raise ModelDirError(f"{path}: {kind[:-1]} {value.name!r} has size {sizes[0][0]} where this manifest's "
                                    f"model config implies {sizes[0][1]} (shape {list(tensor.shape)}); the manifest "
                                    "does not describe this graph: export the model again")
    return session


def _first_difference(got: list[str], want: list[str]) -> str:
    for a, b in zip(got, want, strict=False):
        if a != b:
            return f"{a!r} where {b!r} belongs"
    return "a different count" if len(got) != len(want) else "a different rank"


def directory_options(model_dir: ModelDir, options: SessionOptions) -> SessionOptions:
    """The session options a directory's graphs run with (int8 static: see OrtBackend.from_dir)."""
    if model_dir.int8_mode == "static" and options.device == "cpu":
        return dataclasses.replace(options, fold_qdq=True)
    return options


def run_encoder(encoder: ort.InferenceSession, src: np.ndarray, pad: int) -> dict[str, np.ndarray]:
    """The encoder graph's outputs for (B, S) right-padded source ids."""
    return run(encoder, {"input_ids": src.astype(np.int64), "attention_mask": (src != pad).astype(np.int64)})


def open_graph(path: Path, spec: GraphSpec, options: SessionOptions,
               session_options: ort.SessionOptions | None = None) -> ort.InferenceSession:
    """A session for a graph file already checked against its manifest (verified_graphs), held to the contract."""
    return check_contract_tensors(open_session(path, options, session_options), spec, path)


class OrtBackend:
    """Implements decoding.StepBackend on an encoder and a decoder_step session."""

    def __init__(self, encoder: ort.InferenceSession, decoder: ort.InferenceSession, config: ModelConfig,
                 model_dir: ModelDir | None = None) -> None:
        """model_dir: the directory the sessions came from, where they did."""
        self.encoder, self.decoder, self.config, self.model_dir = encoder, decoder, config, model_dir
        self.step_calls = 0  # decoder_step runs, for tests that count work
        self.names = cache_names(config)

    @property
    def cache_dtype(self) -> np.dtype:
        """float32, or float16 for fp16 graphs exported without --keep-io-types."""
        kind = next(i.type for i in self.decoder.get_inputs() if i.name == self.names.self_inputs[0])
        return np.dtype(np.float16 if kind == "tensor(float16)" else np.float32)

    @classmethod
    def open(cls, directory: Path, options: SessionOptions = DEFAULT_OPTIONS) -> OrtBackend:
        return cls.from_dir(ModelDir.read(directory), options)

    @classmethod
    def from_dir(cls, model_dir: ModelDir, options: SessionOptions = DEFAULT_OPTIONS) -> OrtBackend:
        """Sessions for a model directory, its graphs checked against the manifest's sha256.

        int8 static (Q/DQ) graphs on the CPU run with their Q/DQ as float ops: ONNX Runtime's x86 kernels
        have no fast path for symmetric int8 with per-channel weights, so it would dequantize every weight
        on every call (~10x slower than fp32 on the base config); folded, the weights are dequantized once
        at load and the numbers are the same Q/DQ model's. For int8 speed on CPU, quantize --mode dynamic."""
        options, specs = directory_options(model_dir, options), graph_specs(model_dir.config)
        with model_dir.opening() as paths:
            sessions = [open_graph(paths[g.value], specs[g], options) for g in Graph]
        return cls(*sessions, model_dir.config, model_dir)

    def run_encoder(self, src: np.ndarray) -> dict[str, np.ndarray]:
        return run_encoder(self.encoder, src, self.config.src_pad_idx)

    def encode(self, src: np.ndarray) -> CacheState:
        check_source_length(src.shape[1], self.config.n_position)
        out = self.run_encoder(src)
        dtype, cfg = self.cache_dtype, self.config
        empty = tuple(np.zeros((len(src), cfg.n_head, 0, d), dtype) for d in cache_head_sizes(cfg))
        mask = (src != self.config.src_pad_idx).astype(np.int64)
        return CacheState(mask, tuple(out[name] for name in self.names.cross_outputs), empty)

    def run_step(self, state: CacheState, input_ids: np.ndarray) -> tuple[CacheState, np.ndarray]:
        """Raw decoder_step: (N, T) new tokens -> new state and (N, T, V) logits."""
        check_target_length(state.past_length + input_ids.shape[1], self.config.n_position)
        feeds = {"input_ids": input_ids.astype(np.int64), "encoder_attention_mask": state.mask,
                 **dict(zip(self.names.self_inputs, state.past, strict=True)),
                 **dict(zip(self.names.cross_inputs, state.cross, strict=True))}
        out = run(self.decoder, feeds)
        self.step_calls += 1
        return CacheState(state.mask, state.cross, tuple(out[n] for n in self.names.self_outputs)), out["logits"]

    def step(self, state: CacheState, tokens: np.ndarray, rule: StepRule) -> tuple[CacheState, Candidates]:
        new_state, logits = self.run_step(state, tokens[:, None])
        return new_state, rule.candidates(logits[:, -1])

    def expand(self, state: CacheState, beams: int) -> CacheState:
        return self.select(state, np.repeat(np.arange(len(state.mask)), beams))

    def select(self, state: CacheState, rows: np.ndarray) -> CacheState:
        return CacheState(state.mask[rows], tuple(a[rows] for a in state.cross), tuple(a[rows] for a in state.past))

    def permute(self, state: CacheState, rows: np.ndarray) -> CacheState:
        """Only the rows that change move, in place: most beams keep their row from step to step, and copying
        the whole cache was 18% of a base-size beam search."""
        rows = np.asarray(rows)
        moved = np.flatnonzero(rows != np.arange(len(rows)))
        for a in state.past:
            a[moved] = a[rows[moved]]  # the right side is gathered first, so overlapping moves are safe
        return state
