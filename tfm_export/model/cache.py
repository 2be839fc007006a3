"""Where a decoder step's self-attention keys and values go: what Decoder.step asks of a cache (StepCache), and
the reference's own, ConcatCache, with which the cache grows by concatenation and the step returns it whole (the
graph contract's decoder_step). The step graphs' buffer caches, which exist for export, live beside the graphs
(graphs.buffer_cache).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .attention import Core

KV = tuple[Tensor, Tensor]


class StepCache:
    """What Decoder.step asks of a cache: where new tokens start, how many keys the attention reads, where a layer's
    new keys/values go, and the kernels its attention is computed with (None: the model's own)."""

    single = False  # one new token per row, the encoder's keys/values once per source (else per row)
    start: int | Tensor
    present: list[KV]  # each layer's cache as the step leaves it

    def key_length(self, new_len: int | Tensor) -> int | Tensor:
        raise NotImplementedError

    def extend(self, layer: int, keys: Tensor, values: Tensor) -> KV:
        raise NotImplementedError

    def self_core(self, layer: int) -> Core | None:
        return None

    def cross_core(self, layer: int) -> Core | None:
        return None


class ConcatCache(StepCache):
    """past: per layer (keys, values), (N, nh, P, d) each; new tokens start at position P."""

    def __init__(self, past: list[KV]) -> None:
        self.past, self.present = past, []
        self.start = past[0][0].size(2)

    def key_length(self, new_len: int | Tensor) -> int | Tensor:
        return self.start + new_len

    def extend(self, layer: int, keys: Tensor, values: Tensor) -> KV:
        past_keys, past_values = self.past[layer]
        self.present.append((torch.cat([past_keys, keys], dim=2), torch.cat([past_values, values], dim=2)))
        return self.present[-1]
