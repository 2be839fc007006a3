"""The caches the step graphs are made with: Decoder.step runs the model's own maths over them, and only where
a layer's new keys/values land differs (and, for one, which kernels compute the attention in the exported graph).
- `BufferCache` (decoder_step_search): buffers of fixed capacity that the caller owns. Each layer writes the new
  token's keys/values at position `length` (one ScatterND node in the graph) and attends over the whole buffer
  with the unfilled positions masked. A runtime that binds each buffer as both the graph's past input and its
  present output gets the write in place: nothing is copied or allocated per step. The encoder's keys/values
  come once per source and a source's rows (its beams, consecutive) attend to them together.
- `FusedBufferCache` (decoder_step_search_fused): BufferCache's maths, exported with ONNX Runtime's attention
  kernels (com.microsoft GroupQueryAttention writing the buffers itself, MultiHeadAttention over the source).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from ..model.attention import Core
from ..model.cache import KV, StepCache

MS = "com.microsoft"
MASKED = -1e9  # the reference's masked_fill value, which ONNX Runtime's kernels are told to use


@torch.library.custom_op("tfm::write_at", mutates_args=())
def write_at(buffer: Tensor, index: Tensor, update: Tensor) -> Tensor:
    """ONNX ScatterND: `buffer` with update[i, j, 0] written at buffer[index[i, j, 0]]; index (N, nh, 1, 3) holds
    (row, head, position) triples. One op of its own so that it exports as that single node (graphs.symbolics)."""
    out = buffer.clone()
    out[tuple(index.unbind(-1))] = update
    return out


@write_at.register_fake
def _(buffer: Tensor, index: Tensor, update: Tensor) -> Tensor:
    return torch.empty_like(buffer)


# ONNX Runtime's attention kernels as ops of their own, each exported as that one com.microsoft node
# (graphs.symbolics). Their PyTorch bodies run only while the export traces the graph, where nothing reads their
# values: they give outputs of the kernel's shapes. FusedBufferCache computes the reference maths otherwise.
@torch.library.custom_op("tfm::group_query_attention", mutates_args=())
def group_query_attention(query: Tensor, key: Tensor, value: Tensor, past_key: Tensor, past_value: Tensor,
                          seqlens_k: Tensor, total_sequence_length: Tensor, num_heads: int
                          ) -> tuple[Tensor, Tensor, Tensor]:
    """query/key/value (N, 1, nh * d), past (N, nh, capacity, d) -> output (N, 1, nh * d), present buffers."""
    return torch.zeros_like(query), past_key.clone(), past_value.clone()


@torch.library.custom_op("tfm::multi_head_attention", mutates_args=())
def multi_head_attention(query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor, num_heads: int,
                         mask_filter_value: float) -> Tensor:
    """query (B, G, nh * d), key/value (B, nh, S, d), key_padding_mask (B, S) int32 -> (B, G, nh * d)."""
    return torch.zeros_like(query)


class BufferCache(StepCache):
    """buffers: per layer (keys, values), (N, nh, capacity, d) each, filled up to `length` (a () int64 tensor);
    one new token per row."""

    single = True

    def __init__(self, buffers: list[KV], length: Tensor) -> None:
        self.buffers, self.present, self.start = buffers, [], length
        rows, heads = buffers[0][0].shape[:2]
        device = length.device
        grid = torch.stack(torch.meshgrid(torch.arange(rows, device=device), torch.arange(heads, device=device),
                                          indexing="ij"), dim=-1)
        self.index = torch.cat([grid, length.view(1, 1, 1).expand(rows, heads, 1)], dim=-1)[:, :, None]  # (N, nh, 1, 3)

    def key_length(self, new_len: int | Tensor) -> int | Tensor:
        return self.buffers[0][0].size(2)

    def extend(self, layer: int, keys: Tensor, values: Tensor) -> KV:
        """keys/values: (N, nh, 1, d), written at `length`."""
        self.present.append(tuple(write_at(buffer, self.index, new)
                                  for buffer, new in zip(self.buffers[layer], (keys, values), strict=True)))
        return self.present[-1]


class FusedBufferCache(BufferCache):
    """BufferCache whose attention exports as ONNX Runtime's own CPU/CUDA kernels: a layer's self-attention as one
    GroupQueryAttention node, which writes the new token's keys/values into the buffers (bound as its past and
    present) at `length` and attends over the filled positions only, and cross-attention as MultiHeadAttention over
    the source's keys. In PyTorch, the reference the export is held to, it computes exactly what BufferCache
    does; only the exported graph differs. For equal key and value head sizes, without a relative position bias."""

    def __init__(self, buffers: list[KV], length: Tensor, total: Tensor, heads: int) -> None:
        """total: length + 1 as an int32 scalar the caller feeds from the host (GroupQueryAttention's
        total_sequence_length, which its CUDA kernel reads in host memory); heads: the model's, a constant of the
        kernels (a traced shape would be a tensor)."""
        super().__init__(buffers, length)
        self.total, self.heads = total, heads

    def extend(self, layer: int, keys: Tensor, values: Tensor) -> KV:
        if torch.onnx.is_in_onnx_export():
            return keys, values  # the kernel writes them
        return super().extend(layer, keys, values)

    def self_core(self, layer: int) -> Core | None:
        return partial(self._group_query_attention, layer) if torch.onnx.is_in_onnx_export() else None

    def cross_core(self, layer: int) -> Core | None:
        return self._multi_head_attention if torch.onnx.is_in_onnx_export() else None

    def _group_query_attention(self, layer: int, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                               bias: Tensor | None) -> tuple[Tensor, None]:
        """q, k, v: (N, nh, 1, d) -> (N, nh, 1, d); the present buffers recorded as the layer's cache."""
        (keys, values), (rows, _, _, size) = self.buffers[layer], q.shape
        out, present_keys, present_values = group_query_attention(
            _merged(q), _merged(k), _merged(v), keys, values, self.start.to(torch.int32).expand(rows), self.total,
            self.heads)
        self.present.append((present_keys, present_values))
        return out.view(rows, self.heads, 1, size), None

    def _multi_head_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, bias: Tensor | None
                              ) -> tuple[Tensor, None]:
        """q (B, nh, G, d) of a source's G rows, k/v (B, nh, S, d), mask (B, 1, 1, S) bool -> (B, nh, G, d)."""
        sources, _, group, size = q.shape
        out = multi_head_attention(q.transpose(1, 2).reshape(sources, group, -1), k, v,
                                   mask.reshape(sources, -1).to(torch.int32), self.heads, MASKED)
        return out.view(sources, group, self.heads, size).transpose(1, 2), None


def _merged(heads: Tensor) -> Tensor:
    """(N, nh, 1, d) -> (N, 1, nh * d): one token's heads as the kernels take them."""
    return heads.reshape(heads.size(0), 1, -1)
