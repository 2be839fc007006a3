"""The reference encoder-decoder Transformer, as the attention-is-all-you-need-pytorch seed writes it.

Module and parameter names match the seed's so its state_dicts load unchanged. The maths is the
seed's: post-norm layers, one LayerNorm after embedding + position table, masked_fill(-1e9),
q / sqrt(d_k) before the product. Attention is split into `keys_values` and `attend` so the
export wrappers can feed cached keys/values through the very same code (no second copy of the maths).
Classes are ordered bottom-up.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.config import ModelConfig


def get_pad_mask(seq: Tensor, pad_idx: int) -> Tensor:
    """(B, T) ids -> (B, 1, T) bool, True where a real token is."""
    return (seq != pad_idx).unsqueeze(-2)


def get_subsequent_mask(seq: Tensor) -> Tensor:
    """(B, T) ids -> (1, T, T) bool, True on and below the diagonal."""
    len_s = seq.size(1)
    ones = torch.ones((1, len_s, len_s), device=seq.device)
    return (1 - torch.triu(ones, diagonal=1)).bool()


def step_mask(past_len: int | Tensor, new_len: int | Tensor) -> Tensor:
    """(1, T, P+T) bool: new token i (at position P+i) sees cached and new keys up to itself."""
    keys = torch.arange(past_len + new_len)[None, :]
    queries = past_len + torch.arange(new_len)[:, None]
    return (keys <= queries).unsqueeze(0)


def sinusoid_table(n_position: int, d_hid: int) -> Tensor:
    """(1, n_position, d_hid) interleaved sin/cos table, computed in float64 like the seed."""
    position = np.arange(n_position, dtype=np.float64)[:, None]
    exponent = 2 * (np.arange(d_hid) // 2) / d_hid
    table = position / np.power(10000, exponent)[None, :]
    table[:, 0::2] = np.sin(table[:, 0::2])  # dim 2i
    table[:, 1::2] = np.cos(table[:, 1::2])  # dim 2i+1
    return torch.tensor(table, dtype=torch.float32).unsqueeze(0)


class PositionalEncoding(nn.Module):
    def __init__(self, d_hid: int, n_position: int = 200) -> None:
        super().__init__()
        meta = torch.get_default_device().type == "meta"  # shapes only (checkpoint validation): skip the maths
        self.register_buffer("pos_table", torch.empty(1, n_position, d_hid) if meta else
                             sinusoid_table(n_position, d_hid))

    def forward(self, x: Tensor, start: int | Tensor = 0) -> Tensor:
        # x: (B, T, C); positions start..start+T-1 (start > 0 for cached decoding)
        return x + self.pos_table[:, start:start + x.size(1)]


class ScaledDotProductAttention(nn.Module):
    def __init__(self, temperature: float, attn_dropout: float = 0.1) -> None:
        super().__init__()
        self.temperature = temperature
        self.dropout = nn.Dropout(attn_dropout)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        attn = torch.matmul(q / self.temperature, k.transpose(2, 3))  # (B, nh, Tq, Tk)
        if mask is not None:
            attn = attn.masked_fill(mask == 0, -1e9)
        attn = self.dropout(F.softmax(attn, dim=-1))
        return torch.matmul(attn, v), attn  # (B, nh, Tq, dv)


class MultiHeadAttention(nn.Module):
    def __init__(self, n_head: int, d_model: int, d_k: int, d_v: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.n_head, self.d_k, self.d_v = n_head, d_k, d_v
        self.w_qs = nn.Linear(d_model, n_head * d_k, bias=False)
        self.w_ks = nn.Linear(d_model, n_head * d_k, bias=False)
        self.w_vs = nn.Linear(d_model, n_head * d_v, bias=False)
        self.fc = nn.Linear(n_head * d_v, d_model, bias=False)
        self.attention = ScaledDotProductAttention(temperature=d_k ** 0.5, attn_dropout=dropout)
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)

    def _heads(self, x: Tensor, linear: nn.Linear, size: int) -> Tensor:
        b, t, _ = x.shape
        return linear(x).view(b, t, self.n_head, size).transpose(1, 2)  # (B, nh, T, size)

    def keys_values(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Project key/value inputs (B, T, C) to heads: (B, nh, T, d_k), (B, nh, T, d_v)."""
        return self._heads(k, self.w_ks, self.d_k), self._heads(v, self.w_vs, self.d_v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """q: (B, Tq, C) input; k, v: projected heads; mask: (B, 1|Tq, Tk). Returns LN(q + fc(attn))."""
        b, len_q, _ = q.shape
        residual = q
        heads = self._heads(q, self.w_qs, self.d_k)
        if mask is not None:
            mask = mask.unsqueeze(1)  # broadcast over heads
        out, attn = self.attention(heads, k, v, mask=mask)
        out = out.transpose(1, 2).contiguous().view(b, len_q, -1)  # (B, Tq, nh*dv)
        out = self.dropout(self.fc(out)) + residual
        return self.layer_norm(out), attn

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return self.attend(q, *self.keys_values(k, v), mask=mask)


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_in: int, d_hid: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_in, d_hid)
        self.w_2 = nn.Linear(d_hid, d_in)
        self.layer_norm = nn.LayerNorm(d_in, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        out = self.dropout(self.w_2(F.relu(self.w_1(x)))) + x
        return self.layer_norm(out)


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, d_inner: int, n_head: int, d_k: int, d_v: int, dropout: float) -> None:
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout=dropout)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner, dropout=dropout)

    def forward(self, x: Tensor, slf_attn_mask: Tensor | None = None) -> Tensor:
        x, _ = self.slf_attn(x, x, x, mask=slf_attn_mask)
        return self.pos_ffn(x)


class DecoderLayer(nn.Module):
    def __init__(self, d_model: int, d_inner: int, n_head: int, d_k: int, d_v: int, dropout: float) -> None:
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout=dropout)
        self.enc_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout=dropout)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner, dropout=dropout)

    def forward(self, x: Tensor, enc_output: Tensor, slf_attn_mask: Tensor | None = None,
                dec_enc_attn_mask: Tensor | None = None) -> Tensor:
        x, _ = self.slf_attn(x, x, x, mask=slf_attn_mask)
        x, _ = self.enc_attn(x, enc_output, enc_output, mask=dec_enc_attn_mask)
        return self.pos_ffn(x)

    def step(self, x: Tensor, past_k: Tensor, past_v: Tensor, enc_k: Tensor, enc_v: Tensor,
             slf_attn_mask: Tensor, dec_enc_attn_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """forward() for new tokens only: self-attention keys/values extend the cache (B, nh, P+T, d)."""
        new_k, new_v = self.slf_attn.keys_values(x, x)
        k, v = torch.cat([past_k, new_k], dim=2), torch.cat([past_v, new_v], dim=2)
        x, _ = self.slf_attn.attend(x, k, v, mask=slf_attn_mask)
        x, _ = self.enc_attn.attend(x, enc_k, enc_v, mask=dec_enc_attn_mask)
        return self.pos_ffn(x), k, v


class Embedder(nn.Module):
    """Shared start of encoder and decoder: embedding (x sqrt(d_model)), positions, dropout, LayerNorm."""

    def _build(self, cfg: ModelConfig, layer: type[EncoderLayer] | type[DecoderLayer]) -> None:
        """Everything after the word embedding, under the seed's names (the subclass registers the embedding
        first, under its own name, so the state_dict order is the seed's too)."""
        self.position_enc = PositionalEncoding(cfg.d_model, n_position=cfg.n_position)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layer_stack = nn.ModuleList(
            layer(cfg.d_model, cfg.d_inner, cfg.n_head, cfg.d_k, cfg.d_v, cfg.dropout) for _ in range(cfg.n_layers))
        self.layer_norm = nn.LayerNorm(cfg.d_model, eps=1e-6)
        self.scale_emb, self.d_model = cfg.scale_emb, cfg.d_model

    def _embed(self, seq: Tensor, emb: nn.Embedding, start: int | Tensor = 0) -> Tensor:
        x = emb(seq)
        if self.scale_emb:
            x = x * self.d_model ** 0.5
        x = self.dropout(self.position_enc(x, start))
        return self.layer_norm(x)


class Encoder(Embedder):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.src_word_emb = nn.Embedding(cfg.src_vocab_size, cfg.d_model, padding_idx=cfg.src_pad_idx)
        self._build(cfg, EncoderLayer)

    def forward(self, src_seq: Tensor, src_mask: Tensor) -> Tensor:
        x = self._embed(src_seq, self.src_word_emb)  # (B, S, C)
        for layer in self.layer_stack:
            x = layer(x, slf_attn_mask=src_mask)
        return x


class Decoder(Embedder):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.trg_word_emb = nn.Embedding(cfg.trg_vocab_size, cfg.d_model, padding_idx=cfg.trg_pad_idx)
        self._build(cfg, DecoderLayer)

    def forward(self, trg_seq: Tensor, trg_mask: Tensor, enc_output: Tensor, src_mask: Tensor) -> Tensor:
        x = self._embed(trg_seq, self.trg_word_emb)  # (B, T, C)
        for layer in self.layer_stack:
            x = layer(x, enc_output, slf_attn_mask=trg_mask, dec_enc_attn_mask=src_mask)
        return x

    def cross_keys_values(self, enc_output: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every layer's cross-attention keys/values, computed once per source."""
        return [layer.enc_attn.keys_values(enc_output, enc_output) for layer in self.layer_stack]

    def step(self, trg_new: Tensor, past: list[tuple[Tensor, Tensor]], cross: list[tuple[Tensor, Tensor]],
             src_mask: Tensor) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """New target tokens (B, T) after P cached ones -> output (B, T, C) and the extended cache."""
        past_len = past[0][0].size(2)
        x = self._embed(trg_new, self.trg_word_emb, start=past_len)
        mask = step_mask(past_len, trg_new.size(1))
        present = []
        for layer, (pk, pv), (ek, ev) in zip(self.layer_stack, past, cross, strict=True):
            x, k, v = layer.step(x, pk, pv, ek, ev, mask, src_mask)
            present.append((k, v))
        return x, present


class Transformer(nn.Module):
    """Seed semantics; forward returns logits (B, T, V) rather than the seed's flattened (B*T, V)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.src_pad_idx, self.trg_pad_idx = cfg.src_pad_idx, cfg.trg_pad_idx
        self.scale_prj, self.d_model = cfg.scale_prj, cfg.d_model
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.trg_word_prj = nn.Linear(cfg.d_model, cfg.trg_vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        if cfg.proj_share_weight:
            self.trg_word_prj.weight = self.decoder.trg_word_emb.weight
        if cfg.embs_share_weight:
            self.encoder.src_word_emb.weight = self.decoder.trg_word_emb.weight

    def encode(self, src_seq: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S) ids -> encoder output (B, S, C) and source mask (B, 1, S)."""
        src_mask = get_pad_mask(src_seq, self.src_pad_idx)
        return self.encoder(src_seq, src_mask), src_mask

    def project(self, dec_output: Tensor) -> Tensor:
        logits = self.trg_word_prj(dec_output)  # (B, T, V)
        return logits * self.d_model ** -0.5 if self.scale_prj else logits

    def forward(self, src_seq: Tensor, trg_seq: Tensor) -> Tensor:
        enc_output, src_mask = self.encode(src_seq)
        trg_mask = get_pad_mask(trg_seq, self.trg_pad_idx) & get_subsequent_mask(trg_seq)
        return self.project(self.decoder(trg_seq, trg_mask, enc_output, src_mask))
