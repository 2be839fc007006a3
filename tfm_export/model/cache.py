"""Where a decoder step's self-attention keys and values go: the two caches the step graphs are made with.

The decoder's own code (`Decoder.step`) runs the same maths over either; only where the keys land differs.
- `ConcatCache` (the graph contract's decoder_step): the cache grows by concatenation, the step returns it whole.
- `BufferCache` (decoder_step_search): buffers of fixed capacity that the caller owns. Each layer writes the new
  token's keys/values at position `length` (one ScatterND node in the graph) and attends over the whole buffer
  with the unfilled positions masked. A runtime that binds each buffer as both the graph's past input and its
  present output gets the write in place: nothing is copied or allocated per step. The encoder's keys/values
  come once per source and a source's rows (its beams, consecutive) attend to them together.
"""

from __future__ import annotations

import torch
from torch import Tensor

KV = tuple[Tensor, Tensor]


@torch.library.custom_op("tfm::write_at", mutates_args=())
def write_at(buffer: Tensor, index: Tensor, update: Tensor) -> Tensor:
    """ONNX ScatterND: `buffer` with update[i, j, 0] written at buffer[index[i, j, 0]]; index (N, nh, 1, 3) holds
    (row, head, position) triples. One op of its own so that it exports as that single node (graphs.export)."""
    out = buffer.clone()
    out[tuple(index.unbind(-1))] = update
    return out


@write_at.register_fake
def _(buffer: Tensor, index: Tensor, update: Tensor) -> Tensor:
    return torch.empty_like(buffer)


class ConcatCache:
    """past: per layer (keys, values), (N, nh, P, d) each; new tokens start at position P."""

    single = False  # any number of new tokens; the encoder's keys/values come per row

    def __init__(self, past: list[KV]) -> None:
        self.past, self.present = past, []
        self.start = past[0][0].size(2)

    def key_length(self, new_len: int | Tensor) -> int | Tensor:
        return self.start + new_len

    def extend(self, layer: int, keys: Tensor, values: Tensor) -> KV:
        past_keys, past_values = self.past[layer]
        self.present.append((torch.cat([past_keys, keys], dim=2), torch.cat([past_values, values], dim=2)))
        return self.present[-1]


class BufferCache:
    """buffers: per layer (keys, values), (N, nh, capacity, d) each, filled up to `length` (a () int64 tensor);
    one new token per row."""

    single = True  # one new token per row; the encoder's keys/values come per source

    def __init__(self, buffers: list[KV], length: Tensor) -> None:
        self.buffers, self.present, self.start = buffers, [], length
        rows, heads = buffers[0][0].shape[:2]
        grid = torch.stack(torch.meshgrid(torch.arange(rows), torch.arange(heads), indexing="ij"), dim=-1)
        self.index = torch.cat([grid, length.view(1, 1, 1).expand(rows, heads, 1)], dim=-1)[:, :, None]  # (N, nh, 1, 3)

    def key_length(self, new_len: int | Tensor) -> int | Tensor:
        return self.buffers[0][0].size(2)

    def extend(self, layer: int, keys: Tensor, values: Tensor) -> KV:
        """keys/values: (N, nh, 1, d), written at `length`."""
        self.present.append(tuple(write_at(buffer, self.index, new)
                                  for buffer, new in zip(self.buffers[layer], (keys, values), strict=True)))
        return self.present[-1]
