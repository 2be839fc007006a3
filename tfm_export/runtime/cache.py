"""The decoding state the graph backends share: source mask, cross-attention K/V and the growing
self-attention cache, flat per layer in the graph contract's order (core.graph_spec.cache_names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class CacheState:
    """Per row: source mask (N, S), cross-attention K/V and self-attention K/V, flat per layer. NumPy arrays
    for the ONNX Runtime backend; torch tensors on the run device for IO binding and TensorRT (same shapes).
    Steps and reorders may update it in place (the decoding loops never reuse an old state)."""

    mask: Any
    cross: tuple[Any, ...]  # per layer: key (N, nh, S, dk), value (N, nh, S, dv)
    past: tuple[Any, ...]  # per layer: key (N, nh, P, dk), value (N, nh, P, dv)

    @property
    def past_length(self) -> int:
        return self.past[0].shape[2]
