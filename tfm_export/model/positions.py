"""Where tokens are: a table added to the embeddings (the seed's fixed sinusoid, or a learned one), RoPE
rotating queries and keys in self-attention, or T5's bucketed relative position bias on the scores.

Each takes the first position (the cached length when decoding step by step) and slices precomputed
tables, so the exported graphs derive every position from the past length with Slice/Gather and
integer arithmetic: no new graph inputs, no float maths in the bucketing (exact in every precision).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn


def sinusoid_table(n_position: int, d_hid: int) -> Tensor:
    """(1, n_position, d_hid) interleaved sin/cos table, computed in float64 like the seed."""
    position = np.arange(n_position, dtype=np.float64)[:, None]
    exponent = 2 * (np.arange(d_hid) // 2) / d_hid
    table = position / np.power(10000, exponent)[None, :]
    table[:, 0::2] = np.sin(table[:, 0::2])  # dim 2i
    table[:, 1::2] = np.cos(table[:, 1::2])  # dim 2i+1
    return torch.tensor(table, dtype=torch.float32).unsqueeze(0)


def halves_sinusoid_table(n_position: int, d_hid: int) -> Tensor:
    """(1, n_position, d_hid): the seed's frequencies with every sin first and every cos after them (Marian)."""
    table = sinusoid_table(n_position, d_hid)
    return torch.cat([table[..., 0::2], table[..., 1::2]], dim=-1)


def fairseq_sinusoid_table(n_position: int, d_hid: int, first: int) -> Tensor:
    """(1, n_position, d_hid) [sin | cos] with frequencies 10000^(-i / (d/2 - 1)), rows from position `first`
    on, computed in float32 as fairseq and M2M100/NLLB do (their position of token t is t + pad + 1)."""
    half = d_hid // 2
    freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -(math.log(10000) / (half - 1)))
    angles = torch.arange(first, first + n_position, dtype=torch.int64).float().unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if d_hid % 2:
        table = torch.cat([table, torch.zeros(n_position, 1)], dim=1)
    return table.unsqueeze(0)


def table_rows(table: Tensor, start: int | Tensor, length: int | Tensor) -> Tensor:
    """Rows start..start+length-1 of a (positions, ...) table: a Slice where `start` is a size the graph derives
    from its inputs' shapes (the contract's past length), a Gather where it is a data input (decoder_step_search's
    cache_length: TensorRT takes no data values as Slice bounds)."""
    if isinstance(start, Tensor):
        return table.index_select(0, start + torch.arange(length, device=table.device))
    return table[start:start + length]


def _on_meta() -> bool:
    """A model built on the meta device (checkpoint validation) needs shapes only: skip the tables' maths."""
    return torch.get_default_device().type == "meta"


class PositionalEncoding(nn.Module):
    """The seed's fixed table (a buffer), or a learned one of the same name and shape (a parameter)."""

    def __init__(self, d_hid: int, n_position: int = 200, learned: bool = False) -> None:
        super().__init__()
        table = torch.empty(1, n_position, d_hid) if _on_meta() else sinusoid_table(n_position, d_hid)
        if learned:
            self.pos_table = nn.Parameter(table)  # Transformer's init overwrites it
        else:
            self.register_buffer("pos_table", table)

    def forward(self, x: Tensor, start: int | Tensor = 0) -> Tensor:
        # x: (B, T, C); positions start..start+T-1 (start > 0 for cached decoding)
        if isinstance(start, Tensor):  # rows laid out (T, 1, C), unlike a vocabulary's table: int8 keeps them float
            return x + table_rows(self.pos_table[0].unsqueeze(1), start, x.size(1)).transpose(0, 1)
        return x + self.pos_table[:, start:start + x.size(1)]


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on consecutive pairs: (x_2i, x_2i+1) turned by angle theta_i of each position.
    x: (B, nh, T, d); cos, sin: (T, d), each angle repeated for both dims of its pair."""
    pairs = x.unflatten(-1, (-1, 2))  # (B, nh, T, d/2, 2)
    swapped = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)  # (-x_2i+1, x_2i)
    return x * cos + swapped * sin


class RotaryEmbedding(nn.Module):
    """cos/sin of theta_i * position, theta_i = base^(-2i/d_k), for every position the model takes. Computed,
    never stored in checkpoints (non-persistent buffers)."""

    def __init__(self, d_k: int, n_position: int, base: float) -> None:
        super().__init__()
        self.d_k, self.n_position, self.base = d_k, n_position, base
        self.register_buffer("cos", torch.empty(n_position, d_k), persistent=False)
        self.register_buffer("sin", torch.empty(n_position, d_k), persistent=False)
        if not _on_meta():
            self.materialize()

    def materialize(self) -> None:
        """The tables computed on the CPU (a model built on the meta device has their shapes only)."""
        inv_freq = self.base ** (-np.arange(0, self.d_k, 2, dtype=np.float64) / self.d_k)  # (d/2,)
        angles = np.repeat(np.arange(self.n_position, dtype=np.float64)[:, None] * inv_freq[None, :], 2, axis=1)
        self.cos = torch.tensor(np.cos(angles), dtype=torch.float32)
        self.sin = torch.tensor(np.sin(angles), dtype=torch.float32)

    def forward(self, start: int | Tensor, length: int | Tensor) -> tuple[Tensor, Tensor]:
        """(T, d_k) cos and sin for positions start..start+T-1."""
        return table_rows(self.cos, start, length), table_rows(self.sin, start, length)


def relative_buckets(relative: np.ndarray, bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
    """T5's bucket of each key - query distance: exact below max_exact, log-spaced up to max_distance,
    the last bucket beyond; bidirectional (encoder) splits the buckets by direction, causal (decoder)
    maps every future key to bucket 0. In float32 like T5's own code, so bucket edges agree."""
    buckets = np.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0) * num_buckets
        distance = np.abs(relative)
    else:
        distance = -np.minimum(relative, 0)
    max_exact = num_buckets // 2
    logs = np.log(np.maximum(distance, 1).astype(np.float32) / np.float32(max_exact))
    large = max_exact + (logs / np.float32(math.log(max_distance / max_exact))
                         * np.float32(num_buckets - max_exact)).astype(np.int64)
    return buckets + np.where(distance < max_exact, distance, np.minimum(large, num_buckets - 1))


class RelativePositionBias(nn.Module):
    """One learned scalar per head and bucket (`weight`: (buckets, n_head)), shared by every layer of a stack
    and added to the self-attention scores. Buckets are looked up from a table over every distance the model
    can see (a non-persistent buffer), so the graphs do integer index arithmetic only."""

    def __init__(self, n_head: int, n_position: int, num_buckets: int, max_distance: int,
                 bidirectional: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_buckets, n_head))  # Transformer's init overwrites it
        self.max_distance, self.num_buckets, self.bidirectional = max_distance, num_buckets, bidirectional
        self.offset = n_position - 1  # table index of distance 0
        self.register_buffer("buckets", torch.empty(2 * n_position - 1, dtype=torch.int64), persistent=False)
        if not _on_meta():
            self.materialize()

    def materialize(self) -> None:
        """The bucket table computed on the CPU (a model built on the meta device has its shape only)."""
        relative = np.arange(-self.offset, self.offset + 1, dtype=np.int64)
        table = relative_buckets(relative, self.bidirectional, self.num_buckets, self.max_distance)
        self.buckets = torch.from_numpy(table)

    def forward(self, start: int | Tensor, q_len: int | Tensor, k_len: int | Tensor) -> Tensor:
        """(1, nh, Tq, Tk) bias for queries at start..start+Tq-1 against keys at 0..Tk-1."""
        device = self.buckets.device
        queries = start + torch.arange(q_len, device=device)[:, None]
        keys = torch.arange(k_len, device=device)[None, :]
        bucket = self.buckets[keys - queries + self.offset]  # (Tq, Tk)
        return F.embedding(bucket, self.weight).permute(2, 0, 1).unsqueeze(0)
