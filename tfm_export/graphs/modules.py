"""The two exported graphs as thin modules over the reference model (no second copy of the maths).

Their forward signatures are the graph contract of graph_spec: flat tensors in, flat tensors out,
masks given explicitly (1 = token) rather than derived from the pad id.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..core.tokenizer import FIRST_TOKEN_ID
from ..model.cache import ConcatCache
from ..model.transformer import Transformer


class EncoderGraph(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        src_mask = (attention_mask != 0).unsqueeze(1)  # (B, 1, S)
        enc_output = self.model.encoder(input_ids, src_mask)  # (B, S, C)
        cross = self.model.decoder.cross_keys_values(enc_output)  # n_layers x (B, nh, S, d)
        return (enc_output, *[t for kv in cross for t in kv])


class DecoderStepGraph(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        # past, per layer: decoder key, decoder value, encoder key, encoder value
        layers = [past[4 * i:4 * i + 4] for i in range(len(past) // 4)]
        src_mask = (encoder_attention_mask != 0).unsqueeze(1)  # (B, 1, S)
        x, present = self.model.decoder.step(input_ids, ConcatCache([(k, v) for k, v, _, _ in layers]),
                                             [(k, v) for _, _, k, v in layers], src_mask)
        return (self.model.project(x), *[t for kv in present for t in kv])


def example_inputs(model: Transformer, batch: int = 2, src_len: int = 5, new_len: int = 2,
                   past_len: int = 3) -> dict[str, tuple[Tensor, ...]]:
    """Inputs for tracing: every dynamic size distinct and > 1 so the exporter keeps them symbolic."""
    cfg = model.config
    ids = torch.randint(FIRST_TOKEN_ID, cfg.src_vocab_size, (batch, src_len))
    mask = torch.ones(batch, src_len, dtype=torch.long)
    past = []
    for _ in range(cfg.n_layers):
        past += [torch.randn(batch, cfg.n_head, past_len, cfg.d_k), torch.randn(batch, cfg.n_head, past_len, cfg.d_v),
                 torch.randn(batch, cfg.n_head, src_len, cfg.d_k), torch.randn(batch, cfg.n_head, src_len, cfg.d_v)]
    trg = torch.randint(FIRST_TOKEN_ID, cfg.trg_vocab_size, (batch, new_len))
    return {"encoder": (ids, mask), "decoder_step": (trg, mask, *past)}
