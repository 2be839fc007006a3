"""Masks and multi-head attention, as the seed writes them, plus the variants' optional parts.

Attention is split into `keys_values` and `attend` so the export wrappers can feed cached keys/values
through the very same code (no second copy of the maths). RoPE (when given) turns the queries in
`attend` and the keys in `keys_values`; a relative position bias (when given) is added to the scores.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .norms import SEED_STYLE, NormStyle, Residual
from .positions import rotate_pairs

Rotary = tuple[Tensor, Tensor]  # (T, d_k) cos and sin of the positions being projected
Extend = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]  # new keys/values -> all the attention reads
# (queries, keys, values, mask, bias) -> (attention output (B, nh, Tq, dv), weights or None): a cache's own kernel
Core = Callable[..., tuple[Tensor, Tensor | None]]


def get_pad_mask(seq: Tensor, pad_idx: int) -> Tensor:
    """(B, T) ids -> (B, 1, T) bool, True where a real token is."""
    return (seq != pad_idx).unsqueeze(-2)


def get_subsequent_mask(seq: Tensor) -> Tensor:
    """(B, T) ids -> (1, T, T) bool, True on and below the diagonal."""
    len_s = seq.size(1)
    ones = torch.ones((1, len_s, len_s), device=seq.device)
    return (1 - torch.triu(ones, diagonal=1)).bool()


def step_mask(start: int | Tensor, new_len: int | Tensor, key_len: int | Tensor,
              device: torch.device | None = None) -> Tensor:
    """(1, T, K) bool on `device`: new token i (at position start+i) sees the keys at positions 0..start+i of the K
    the cache holds (a buffer of fixed capacity holds more keys than are filled: those stay hidden)."""
    keys = torch.arange(key_len, device=device)[None, :]
    queries = start + torch.arange(new_len, device=device)[:, None]
    return (keys <= queries).unsqueeze(0)


class ScaledDotProductAttention(nn.Module):
    def __init__(self, temperature: float, attn_dropout: float = 0.1) -> None:
        super().__init__()
        self.temperature = temperature
        self.dropout = nn.Dropout(attn_dropout)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
        attn = torch.matmul(q / self.temperature, k.transpose(2, 3))  # (B, nh, Tq, Tk)
        if bias is not None:
            attn = attn + bias  # (1, nh, Tq, Tk) relative position bias
        if mask is not None:
            attn = attn.masked_fill(mask == 0, -1e9)
        attn = self.dropout(F.softmax(attn, dim=-1))
        return torch.matmul(attn, v), attn  # (B, nh, Tq, dv)


class MultiHeadAttention(Residual):
    def __init__(self, n_head: int, d_model: int, d_k: int, d_v: int, dropout: float = 0.1, *,
                 style: NormStyle = SEED_STYLE, bias: bool = False) -> None:
        super().__init__()
        self.n_head, self.d_k, self.d_v = n_head, d_k, d_v
        self.w_qs = nn.Linear(d_model, n_head * d_k, bias=bias)
        self.w_ks = nn.Linear(d_model, n_head * d_k, bias=bias)
        self.w_vs = nn.Linear(d_model, n_head * d_v, bias=bias)
        self.fc = nn.Linear(n_head * d_v, d_model, bias=bias)
        self.attention = ScaledDotProductAttention(temperature=d_k ** 0.5, attn_dropout=dropout)
        self.dropout = nn.Dropout(dropout)
        self._add_norms(d_model, style)

    def _heads(self, x: Tensor, linear: nn.Linear, size: int, single: bool = False) -> Tensor:
        """single: x holds one token per row (T = 1), whose head split is a reshape: no Transpose in the graph."""
        b, t, _ = x.shape
        if single:
            return linear(x).view(b, self.n_head, 1, size)
        return linear(x).view(b, t, self.n_head, size).transpose(1, 2)  # (B, nh, T, size)

    def keys_values(self, k: Tensor, v: Tensor, rotary: Rotary | None = None,
                    single: bool = False) -> tuple[Tensor, Tensor]:
        """Project key/value inputs (B, T, C) to heads: (B, nh, T, d_k), (B, nh, T, d_v)."""
        keys = self._heads(k, self.w_ks, self.d_k, single)
        if rotary is not None:
            keys = rotate_pairs(keys, *rotary)
        return keys, self._heads(v, self.w_vs, self.d_v, single)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               core: Core | None = None) -> tuple[Tensor, Tensor | None]:
        """q: (B, Tq, C) input; k, v: projected heads; mask: (B, 1|Tq, Tk); core: a kernel to compute the attention
        with instead of this module's (model.cache). Returns the sublayer's output (the seed's LN(q + fc(attn))) and
        the attention weights."""
        return self._attend(q, self.sublayer_input(q), k, v, mask, core=core)

    def self_attend(self, x: Tensor, mask: Tensor | None, bias: Tensor | None = None, rotary: Rotary | None = None,
                    extend: Extend | None = None, single: bool = False,
                    core: Core | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention over x (B, T, C); `extend` puts the new keys/values (B, nh, T, d) into a decoder's
        cache and returns everything the attention reads, `core` is the cache's own kernel if it has one
        (model.cache); single: one token per row. Returns the output and those keys and values. Keys see the
        normalised input, as queries do."""
        h = self.sublayer_input(x)
        k, v = self.keys_values(h, h, rotary, single)
        if extend is not None:
            k, v = extend(k, v)
        out, _ = self._attend(x, h, k, v, mask, bias, rotary, single, core)
        return out, k, v

    def _attend(self, x: Tensor, h: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None = None,
                rotary: Rotary | None = None, single: bool = False,
                core: Core | None = None) -> tuple[Tensor, Tensor | None]:
        """x: the residual stream; h: what the queries are projected from (x, or its norm)."""
        b, len_q, _ = x.shape
        residual = x
        heads = self._heads(h, self.w_qs, self.d_k, single)
        if rotary is not None:
            heads = rotate_pairs(heads, *rotary)
        if mask is not None:
            mask = mask.unsqueeze(1)  # broadcast over heads
        out, attn = (core or self.attention)(heads, k, v, mask=mask, bias=bias)
        if single:  # (B, nh, 1, dv) is laid out as (B, 1, nh*dv)
            return self.residual(residual, self.dropout(self.fc(out.view(b, 1, -1)))), attn
        out = out.transpose(1, 2).contiguous().view(b, len_q, -1)  # (B, Tq, nh*dv)
        return self.residual(residual, self.dropout(self.fc(out))), attn

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.attend(q, *self.keys_values(k, v), mask=mask)
