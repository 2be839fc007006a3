"""Encoder and decoder layers: self-attention (+ cross-attention) + FFN, each sublayer with its own norm."""

from __future__ import annotations

from torch import Tensor, nn

from ..core.config import ModelConfig
from .attention import MultiHeadAttention, Rotary
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

    def step(self, x: Tensor, past_k: Tensor, past_v: Tensor, enc_k: Tensor, enc_v: Tensor,
             slf_attn_mask: Tensor, dec_enc_attn_mask: Tensor, bias: Tensor | None = None,
             rotary: Rotary | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """forward() for new tokens only: self-attention keys/values extend the cache (B, nh, P+T, d)."""
        x, k, v = self.slf_attn.self_attend(x, slf_attn_mask, bias, rotary, past=(past_k, past_v))
        x, _ = self.enc_attn.attend(x, enc_k, enc_v, mask=dec_enc_attn_mask)
        return self.pos_ffn(x), k, v
