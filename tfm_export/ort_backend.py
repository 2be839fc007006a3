"""The ONNX Runtime backend: encoder once, decoder_step per token, the KV cache fed back as arrays."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .config import ModelConfig
from .errors import InputTextError
from .graph_spec import Graph, cache_name
from .model_dir import graph_path, read_manifest
from .ort_session import DEFAULT_OPTIONS, SessionOptions, open_session, run
from .tokenizer import PAD_ID


@dataclass(frozen=True)
class CacheState:
    """Per row: source mask (N, S), cross-attention K/V and self-attention K/V, flat per layer.
    NumPy arrays here; torch tensors on the run device in ort_bound_backend (same shapes)."""

    mask: np.ndarray
    cross: tuple[np.ndarray, ...]  # per layer: key (N, nh, S, dk), value (N, nh, S, dv)
    past: tuple[np.ndarray, ...]  # per layer: key (N, nh, P, dk), value (N, nh, P, dv)

    @property
    def past_length(self) -> int:
        return self.past[0].shape[2]


class OrtBackend:
    """Implements decoding.StepBackend on an encoder and a decoder_step session."""

    def __init__(self, encoder: ort.InferenceSession, decoder: ort.InferenceSession, config: ModelConfig,
                 manifest: dict | None = None) -> None:
        self.encoder, self.decoder, self.config, self.manifest = encoder, decoder, config, manifest or {}
        self.step_calls = 0  # decoder_step runs, for tests that count work
        layers, roles = range(config.n_layers), ("key", "value")
        self.cross_output_names = [cache_name("present", i, "encoder", r) for i in layers for r in roles]
        self.self_output_names = [cache_name("present", i, "decoder", r) for i in layers for r in roles]
        self.self_input_names = [cache_name("past_key_values", i, "decoder", r) for i in layers for r in roles]
        self.cross_input_names = [cache_name("past_key_values", i, "encoder", r) for i in layers for r in roles]

    @property
    def cache_dtype(self) -> np.dtype:
        """float32, or float16 for fp16 graphs exported without --keep-io-types."""
        kind = next(i.type for i in self.decoder.get_inputs() if i.name == self.self_input_names[0])
        return np.dtype(np.float16 if kind == "tensor(float16)" else np.float32)

    @classmethod
    def open(cls, directory: Path, options: SessionOptions = DEFAULT_OPTIONS) -> OrtBackend:
        """Sessions for a model directory, its graphs checked against the manifest's sha256.

        int8 static (Q/DQ) graphs on the CPU run with their Q/DQ as float ops: ONNX Runtime's x86 kernels
        have no fast path for symmetric int8 with per-channel weights, so it would dequantize every weight
        on every call (~10x slower than fp32 on the base config); folded, the weights are dequantized once
        at load and the numbers are the same Q/DQ model's. For int8 speed on CPU, quantize --mode dynamic."""
        manifest = read_manifest(Path(directory))
        if manifest.get("int8", {}).get("mode") == "static" and options.device == "cpu":
            options = dataclasses.replace(options, fold_qdq=True)
        sessions = [open_session(graph_path(Path(directory), manifest, g.value), options) for g in Graph]
        return cls(*sessions, ModelConfig.from_dict(manifest["model"]), manifest)

    def run_encoder(self, src: np.ndarray) -> dict[str, np.ndarray]:
        mask = (src != PAD_ID).astype(np.int64)
        return self._run(self.encoder, {"input_ids": src.astype(np.int64), "attention_mask": mask})

    def _run(self, session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run(session, feeds)  # one place, so calibration can record every call's inputs

    def check_source(self, length: int) -> None:
        if length > self.config.n_position:
            raise InputTextError(f"source of {length} tokens (with <s> and </s>) is longer than the model's "
                                 f"{self.config.n_position} positions (manifest limits.max_source_length)")

    def check_target(self, past: int, new: int) -> None:
        if past + new > self.config.n_position:
            raise InputTextError(f"decoding past {self.config.n_position} target positions "
                                 "(manifest limits.max_target_length); lower --max-length")

    def encode(self, src: np.ndarray) -> CacheState:
        self.check_source(src.shape[1])
        out = self.run_encoder(src)
        cfg = self.config
        dtype = self.cache_dtype
        empty = [np.zeros((len(src), cfg.n_head, 0, d), dtype) for d in (cfg.d_k, cfg.d_v)] * cfg.n_layers
        mask = (src != PAD_ID).astype(np.int64)
        return CacheState(mask, tuple(out[name] for name in self.cross_output_names), tuple(empty))

    def run_step(self, state: CacheState, input_ids: np.ndarray) -> tuple[CacheState, np.ndarray]:
        """Raw decoder_step: (N, T) new tokens -> new state and (N, T, V) logits."""
        self.check_target(state.past_length, input_ids.shape[1])
        feeds = {"input_ids": input_ids.astype(np.int64), "encoder_attention_mask": state.mask,
                 **dict(zip(self.self_input_names, state.past, strict=True)),
                 **dict(zip(self.cross_input_names, state.cross, strict=True))}
        out = self._run(self.decoder, feeds)
        self.step_calls += 1
        return CacheState(state.mask, state.cross, tuple(out[n] for n in self.self_output_names)), out["logits"]

    def step(self, state: CacheState, tokens: np.ndarray) -> tuple[CacheState, np.ndarray]:
        new_state, logits = self.run_step(state, tokens[:, None])
        return new_state, logits[:, -1]

    def reorder(self, state: CacheState, rows: np.ndarray, same_sources: bool = False) -> CacheState:
        """Beam reshuffles within each input (same_sources) move only the rows that change, in place: most
        beams keep their row from step to step, and copying the whole cache was 18% of a base-size beam
        search. The old state is not used again by the decoding loop."""
        rows = np.asarray(rows)
        if same_sources and len(rows) == len(state.mask):
            moved = np.flatnonzero(rows != np.arange(len(rows)))
            for a in state.past:
                a[moved] = a[rows[moved]]  # the right side is gathered first, so overlapping moves are safe
            return state
        past = tuple(a[rows] for a in state.past)
        if same_sources:
            return CacheState(state.mask, state.cross, past)
        return CacheState(state.mask[rows], tuple(a[rows] for a in state.cross), past)
