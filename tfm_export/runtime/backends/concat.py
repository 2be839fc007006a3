"""The contract's cache: encoder once, then decoder_step per token, whose graph returns the whole grown cache
(a Concat of past and new), fed back as the next step's past. The plainest loop over the graph contract, run by any
session loader (ONNX Runtime, or a native Triton model in the bls layout); its logits are reduced in NumPy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.config import ModelConfig
from ...core.graph_spec import ENCODER_ATTENTION_MASK, INPUT_IDS, LOGITS, cache_head_sizes, cache_names
from ...core.sources import check_source_length, check_target_length
from ..counts import WorkCounts
from ..session import run
from ..step import Candidates, Reorders, StepRule
from .loaders import run_encoder


@dataclass
class CacheState:
    """Per row: source mask (N, S), cross-attention K/V and self-attention K/V, flat per layer in the contract's
    order (core.graph_spec.cache_names). NumPy arrays, or device tensors where a loader keeps them there (the bls
    layout on a GPU). Steps and reorders may update it in place (the loops never reuse an old state)."""

    mask: Any
    cross: tuple[Any, ...]  # per layer: key (N, nh, S, dk), value (N, nh, S, dv)
    past: tuple[Any, ...]  # per layer: key (N, nh, P, dk), value (N, nh, P, dv)

    @property
    def past_length(self) -> int:
        return self.past[0].shape[2]

    @property
    def rows(self) -> int:
        return len(self.mask)


class ConcatBackend(Reorders):
    """StepBackend (and GraphBackend) on an encoder and a decoder_step session."""

    def __init__(self, encoder: Any, decoder: Any, config: ModelConfig, model_dir: Any = None,
                 shared: Mapping[str, Any] | None = None) -> None:
        """model_dir: the directory the sessions came from, where they did; shared: memory both sessions read
        (the tied table they were given), which lives as long as they do."""
        self.encoder, self.decoder, self.config, self.model_dir = encoder, decoder, config, model_dir
        self.shared = shared or {}
        self.counts: WorkCounts | None = None  # given by those who count work
        self.names = cache_names(config)

    @property
    def cache_dtype(self) -> np.dtype:
        """float32, or float16 for fp16 graphs exported without --keep-io-types."""
        kind = next(i.type for i in self.decoder.get_inputs() if i.name == self.names.self_inputs[0])
        return np.dtype(np.float16 if kind == "tensor(float16)" else np.float32)

    def run_encoder(self, src: np.ndarray) -> dict[str, np.ndarray]:
        return run_encoder(self.encoder, src, self.config.src_pad_idx)

    def encode(self, src: np.ndarray) -> CacheState:
        check_source_length(src.shape[1], self.config.n_position)
        return self.encoded(src, self.run_encoder(src))

    def encoded(self, src: np.ndarray, out: dict[str, np.ndarray]) -> CacheState:
        dtype, cfg = self.cache_dtype, self.config
        empty = tuple(np.zeros((len(src), cfg.n_head, 0, d), dtype) for d in cache_head_sizes(cfg))
        mask = (src != self.config.src_pad_idx).astype(np.int64)
        return CacheState(mask, tuple(out[name] for name in self.names.cross_outputs), empty)

    def run_step(self, state: CacheState, input_ids: np.ndarray) -> tuple[CacheState, np.ndarray]:
        """Raw decoder_step: (N, T) new tokens -> new state and (N, T, V) logits."""
        check_target_length(state.past_length + input_ids.shape[1], self.config.n_position)
        feeds = {INPUT_IDS: input_ids.astype(np.int64), ENCODER_ATTENTION_MASK: state.mask,
                 **dict(zip(self.names.self_inputs, state.past, strict=True)),
                 **dict(zip(self.names.cross_inputs, state.cross, strict=True))}
        out = run(self.decoder, feeds)
        if self.counts is not None:
            self.counts.run(len(input_ids))
        return CacheState(state.mask, state.cross, tuple(out[n] for n in self.names.self_outputs)), out[LOGITS]

    def step(self, state: CacheState, tokens: np.ndarray, rule: StepRule) -> tuple[CacheState, Candidates]:
        new_state, logits = self.run_step(state, tokens[:, None])
        return new_state, rule.candidates(logits[:, -1])

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
