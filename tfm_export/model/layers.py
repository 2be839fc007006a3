"""Encoder and decoder layers: self-attention (+ cross-attention) + FFN, each sublayer with its own norm."""

from __future__ import annotations

from functools import partial

from torch import Tensor, nn

from ..core.config import ModelConfig
from .attention import MultiHeadAttention, Rotary
from .cache import StepCache
from .ffn import PositionwiseFeedForward
from .norms import NormStyle


def _attention(cfg: ModelConfig) -> MultiHeadAttention:
    return MultiHeadAttention(cfg.n_head, cfg.d_model, cfg.d_k, cfg.d_v, dropout=cfg.dropout,
                              style=NormStyle.of(cfg), bias=cfg.attention_bias)


def _ffn(cfg: ModelConfig) -> PositionwiseFeedForward:
    return PositionwiseFeedForward(cfg.d_model, cfg.d_inner, dropout=cfg.dropout, style=NormStyle.of(cfg),
                                   activation=cfg.activation, bias=cfg.ffn_bias)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.slf_attn = _attention(cfg)
        self.pos_ffn = _ffn(cfg)

    def forward(self, x: Tensor, slf_attn_mask: Tensor | None = None, bias: Tensor | None = None,
                rotary: Rotary | None = None) -> Tensor:
        x, _, _ = self.slf_attn.self_attend(x, slf_attn_mask, bias, rotary)
        return self.pos_ffn(x)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.slf_attn = _attention(cfg)
        self.enc_attn = _attention(cfg)
        self.pos_ffn = _ffn(cfg)

    def forward(self, x: Tensor, enc_output: Tensor, slf_attn_mask: Tensor | None = None,
                dec_enc_attn_mask: Tensor | None = None, bias: Tensor | None = None,
                rotary: Rotary | None = None) -> Tensor:
        x, _, _ = self.slf_attn.self_attend(x, slf_attn_mask, bias, rotary)
        x, _ = self.enc_attn(x, enc_output, enc_output, mask=dec_enc_attn_mask)
        return self.pos_ffn(x)

    def step(self, x: Tensor, cache: StepCache, layer: int, enc_k: Tensor, enc_v: Tensor, slf_attn_mask: Tensor,
             dec_enc_attn_mask: Tensor, bias: Tensor | None = None, rotary: Rotary | None = None) -> Tensor:
        """forward() for new tokens only, the cache putting their keys/values in place (model.cache). A single-token
        cache takes enc_k/enc_v/mask once per source, x's rows being equal consecutive groups per source; a group's
        rows are one query sequence over its source (cross-attention is per position, so this is the same maths
        without a copy of the source's keys per row)."""
        x, _, _ = self.slf_attn.self_attend(x, slf_attn_mask, bias, rotary, partial(cache.extend, layer), cache.single,
                                            cache.self_core(layer))
        if cache.single:
            rows = x.shape
            x, _ = self.enc_attn.attend(x.reshape(enc_k.size(0), -1, rows[-1]), enc_k, enc_v, dec_enc_attn_mask,
                                        cache.cross_core(layer))
            x = x.reshape(rows)
        else:
            x, _ = self.enc_attn.attend(x, enc_k, enc_v, mask=dec_enc_attn_mask)
        return self.pos_ffn(x)
