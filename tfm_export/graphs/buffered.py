"""decoder_step_buffered: one decoder step over caller-owned cache buffers (core.graph_spec.GraphVariant).

The contract's decoder_step returns the whole grown cache, so ONNX Runtime copies every layer's cache
(Concat) and allocates it afresh at every step, a cost that grows with the output. Here each layer's
self-attention reads a fixed-capacity buffer up to `cache_length`, attends to the new token's own key
apart, and returns only that key/value; the caller writes them into its buffer. Standard ONNX ops, no
If/Loop, one token per call (so head splits need no Transpose). The encoder's keys/values come once per
source and a source's beams attend to them together. Built from the reference model's own
layers and weights; the parity check holds it to the full-sequence forward like the other graphs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.tokenizer import FIRST_TOKEN_ID
from ..model.transformer import MultiHeadAttention, Transformer

MASKED = -1e9  # the reference's masked_fill value: exp() of it underflows to exactly 0


def _heads(x: Tensor, n_head: int) -> Tensor:
    """(N, 1, nh*d) -> (N, nh, 1, d); for one token the head split is a reshape."""
    return x.view(x.size(0), n_head, 1, -1)


def _query_weight(attn: MultiHeadAttention) -> Tensor:
    """W_q with 1/temperature folded in (exact where sqrt(d_k) is a power of two, as for d_k 64): left on q, ONNX
    Runtime makes it the score MatMul's alpha, measured 5-10% slower per step at 8-32 rows."""
    return attn.w_qs.weight / attn.attention.temperature


def _merged(x: Tensor) -> Tensor:
    """(N, nh, 1, d) -> (N, 1, nh*d)."""
    return x.view(x.size(0), 1, -1)


class _SelfAttention(nn.Module):
    """The reference self-attention for one new token over a cache buffer; Q, K and V in one MatMul."""

    def __init__(self, attn: MultiHeadAttention) -> None:
        super().__init__()
        self.attn = attn
        self.qkv = nn.Parameter(torch.cat([_query_weight(attn), attn.w_ks.weight, attn.w_vs.weight]).detach(),
                                requires_grad=False)
        self.sizes = [attn.n_head * attn.d_k, attn.n_head * attn.d_k, attn.n_head * attn.d_v]

    def forward(self, x: Tensor, keys: Tensor, values: Tensor, filled: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # x (N, 1, C); keys/values (N, nh, capacity, d); filled (capacity,) bool
        attn = self.attn
        q, k, v = (_heads(t, attn.n_head) for t in F.linear(x, self.qkv).split(self.sizes, dim=-1))
        past = torch.matmul(q, keys.transpose(2, 3)).masked_fill(~filled, MASKED)  # (N, nh, 1, capacity)
        own = (q * k).sum(-1, keepdim=True)  # (N, nh, 1, 1): one product per row and head, no batched GEMM
        weights = F.softmax(torch.cat([past, own], dim=-1), dim=-1)
        out = torch.matmul(weights[..., :-1], values) + weights[..., -1:] * v  # (N, nh, 1, dv)
        return attn.layer_norm(attn.fc(_merged(out)) + x), k, v


def _cross_attention(attn: MultiHeadAttention, x: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """The reference cross-attention for one token per row. x (N, 1, C): B equal groups of rows, one per
    source; keys/values (B, nh, S, d) and mask (B, 1, 1, S) bool (True on source tokens) once per source, so
    beams share them: a group's queries are one (group, S) product instead of a copy of the keys per beam."""
    sources, rows = keys.size(0), x.size(0)
    q = F.linear(x, _query_weight(attn))
    q = q.view(sources, -1, attn.n_head, attn.d_k).transpose(1, 2)  # (B, nh, group, dk)
    scores = torch.matmul(q, keys.transpose(2, 3)).masked_fill(~mask, MASKED)
    out = torch.matmul(F.softmax(scores, dim=-1), values).transpose(1, 2)  # (B, group, nh, dv)
    return attn.layer_norm(attn.fc(out.reshape(rows, 1, -1)) + x)


class BufferedDecoderStepGraph(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model
        self.self_attention = nn.ModuleList(_SelfAttention(layer.slf_attn) for layer in model.decoder.layer_stack)

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, cache_length: Tensor,
                *past: Tensor) -> tuple[Tensor, ...]:
        # past, per layer: decoder key buffer, decoder value buffer, encoder key, encoder value
        decoder = self.model.decoder
        x = decoder.trg_word_emb(input_ids)  # (N, 1, C)
        if decoder.scale_emb:
            x = x * decoder.d_model ** 0.5
        # the position row by Gather (a Slice starting at an input value would be a shape tensor for TensorRT),
        # from the table laid out (positions, 1, C): not a vocabulary embedding, so int8 keeps it float
        positions = decoder.position_enc.pos_table[0].unsqueeze(1)
        x = decoder.layer_norm(x + positions.index_select(0, cache_length.view(1)))
        filled = torch.arange(past[0].size(2)) < cache_length  # (capacity,)
        mask = (encoder_attention_mask != 0)[:, None, None, :]  # (B, 1, 1, S)
        new = []
        for i, (layer, attend) in enumerate(zip(decoder.layer_stack, self.self_attention, strict=True)):
            keys, values, enc_keys, enc_values = past[4 * i:4 * i + 4]
            x, k, v = attend(x, keys, values, filled)
            x = layer.pos_ffn(_cross_attention(layer.enc_attn, x, enc_keys, enc_values, mask))
            new += [k, v]
        return (self.model.project(x), *new)


def buffered_example_inputs(model: Transformer, sources: int = 2, group: int = 3, src_len: int = 5,
                            capacity: int = 4) -> tuple[Tensor, ...]:
    """Inputs for tracing: every dynamic size distinct and > 1 so the exporter keeps them symbolic."""
    cfg, batch = model.config, sources * group
    mask = torch.ones(sources, src_len, dtype=torch.long)
    past = []
    for _ in range(cfg.n_layers):
        past += [torch.randn(batch, cfg.n_head, capacity, cfg.d_k), torch.randn(batch, cfg.n_head, capacity, cfg.d_v),
                 torch.randn(sources, cfg.n_head, src_len, cfg.d_k),
                 torch.randn(sources, cfg.n_head, src_len, cfg.d_v)]
    ids = torch.randint(FIRST_TOKEN_ID, cfg.trg_vocab_size, (batch, 1))
    return (ids, mask, torch.tensor(capacity - 1), *past)
