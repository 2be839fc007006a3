"""decoder_step_search: the decoder's own step over in-place cache buffers, ending in the search's reduction
(core.graph_spec.search_step_spec).

The maths is the model's (`Decoder.step` over a buffer_cache.BufferCache); this module only adds what the search
does with a step's logits, so that K numbers per row leave the graph instead of the vocabulary's logits:
log-softmax over every token, the decoding rules (an additive token bias: banned ids and </s> before the minimum
length at -inf; a forced token, whose log-probability becomes 0 as generate()'s forcing leaves it), then TopK,
sorted, equal logits to the lower id (ONNX TopK's order, the reference decoders' rule).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.graph_spec import search_top_k
from ..core.tokenizer import FIRST_TOKEN_ID
from ..model.transformer import Transformer
from .buffer_cache import BufferCache, FusedBufferCache


def select(logits: Tensor, token_bias: Tensor, forced_token: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(N, 1, V) logits -> (N, k) log-probabilities after the rules and their ids, best first.

    One vocabulary-sized tensor at a time (16 MB at 128 rows of a 32k vocabulary: the decode's memory peak is
    these): the Squeeze reads the bound logits in place; the log-softmax is reduced to one number per row
    (its value at the row's maximum, -log(sum(exp(x - max)))) before the ranking tensor, the logits plus the
    rules, exists; and only the K best are normalised, (x - max) + that number, the very sum the log-softmax
    computes for them. Ranking by the logits keeps the log-softmax's order and tells apart two logits whose
    log-probabilities round equal. The forced token's row (0 at its id, -inf elsewhere) is one row whose K
    best replace every row's K best, the same numbers as a TopK over N copies of it."""
    rows = logits.squeeze(1).float()
    shift = F.log_softmax(rows, dim=-1).amax(dim=-1, keepdim=True)
    top = rows.amax(dim=-1, keepdim=True)
    values, ids = torch.topk(rows + token_bias, k, dim=-1)
    values = (values - top) + shift
    only = torch.where(torch.arange(logits.size(-1)) == forced_token, 0.0, -torch.inf)[None]  # (1, V)
    forced_values, forced_ids = torch.topk(only, k, dim=-1)
    forced = forced_token >= 0
    return torch.where(forced, forced_values, values), torch.where(forced, forced_ids, ids)


class DecoderStepSearchGraph(nn.Module):
    """fused: the attention in ONNX Runtime's kernels (decoder_step_search_fused)."""

    def __init__(self, model: Transformer, fused: bool = False) -> None:
        super().__init__()
        self.model, self.k, self.cache = model, search_top_k(model.config), FusedBufferCache if fused else BufferCache

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, cache_length: Tensor, token_bias: Tensor,
                forced_token: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        # fused: total_sequence_length (int32, cache_length + 1, from the host) first; then per layer: decoder key
        # buffer, decoder value buffer, encoder key, encoder value (per source)
        total, past = (past[0], past[1:]) if self.cache is FusedBufferCache else (None, past)
        layers = [past[4 * i:4 * i + 4] for i in range(len(past) // 4)]
        src_mask = (encoder_attention_mask != 0).unsqueeze(1)  # (B, 1, S)
        buffers = [(k, v) for k, v, _, _ in layers]
        cache = self.cache(buffers, cache_length) if total is None else \
            self.cache(buffers, cache_length, total, self.model.config.n_head)
        x, present = self.model.decoder.step(input_ids, cache, [(k, v) for _, _, k, v in layers], src_mask)
        logits = self.model.project(x)  # (N, 1, V)
        values, ids = select(logits, token_bias, forced_token, self.k)
        return (logits, values, ids, *[t for kv in present for t in kv])


def decoder_step_search_inputs(model: Transformer, fused: bool = False, sources: int = 2, group: int = 3,
                               src_len: int = 5, capacity: int = 4) -> tuple[Tensor, ...]:
    """Inputs for tracing: every dynamic size distinct and > 1 so the exporter keeps them symbolic."""
    cfg, batch = model.config, sources * group
    mask = torch.ones(sources, src_len, dtype=torch.long)
    past = []
    for _ in range(cfg.n_layers):
        past += [torch.randn(batch, cfg.n_head, capacity, cfg.d_k), torch.randn(batch, cfg.n_head, capacity, cfg.d_v),
                 torch.randn(sources, cfg.n_head, src_len, cfg.d_k),
                 torch.randn(sources, cfg.n_head, src_len, cfg.d_v)]
    ids = torch.randint(FIRST_TOKEN_ID, cfg.trg_vocab_size, (batch, 1))
    bias = torch.zeros(cfg.trg_vocab_size)
    total = (torch.tensor(capacity, dtype=torch.int32),) if fused else ()
    return (ids, mask, torch.tensor(capacity - 1), bias, torch.tensor(-1), *total, *past)
