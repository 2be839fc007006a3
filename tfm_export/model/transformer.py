"""The reference encoder-decoder Transformer, as the attention-is-all-you-need-pytorch seed writes it, and
its variants (core.variants) chosen by the config.

Module and parameter names match the seed's so its state_dicts load unchanged; a variant keeps the seed's
name for every part the seed has and gives new parts plain names (`final_norm`, `sandwich_norm`, `w_3`,
`relative_attention_bias`). With the classic config the maths is the seed's: post-norm layers, one
LayerNorm after embedding + position table, masked_fill(-1e9), q / sqrt(d_k) before the product. The
parts live in norms, positions, attention, ffn and layers; classes are ordered bottom-up.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.config import ModelConfig
from ..core.variants import FINAL_NORM_PLACEMENTS
from .attention import (  # noqa: F401  (re-exported: the seed's module had them all)
    MultiHeadAttention,
    Rotary,
    ScaledDotProductAttention,
    get_pad_mask,
    get_subsequent_mask,
    step_mask,
)
from .cache import StepCache
from .layers import DecoderLayer, EncoderLayer
from .norms import NormStyle, make_norm
from .positions import PositionalEncoding, RelativePositionBias, RotaryEmbedding, sinusoid_table  # noqa: F401


class Embedder(nn.Module):
    """Shared start and end of encoder and decoder: embedding (x sqrt(d_model)), position table, dropout,
    embedding norm; the stack's RoPE tables or relative bias; the final norm of pre-norm placements."""

    def _build(self, cfg: ModelConfig, layer: type[EncoderLayer] | type[DecoderLayer], bidirectional: bool) -> None:
        """Everything after the word embedding, under the seed's names (the subclass registers the embedding
        first, under its own name, so the state_dict order is the seed's too)."""
        style = NormStyle.of(cfg)
        self.position_enc = (PositionalEncoding(cfg.d_model, n_position=cfg.n_position,
                                                learned=cfg.positions == "learned")
                             if cfg.positions in ("sinusoid", "learned") else None)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layer_stack = nn.ModuleList(layer(cfg) for _ in range(cfg.n_layers))
        self.layer_norm = make_norm(style, cfg.d_model) if cfg.embedding_norm else None
        self.final_norm = make_norm(style, cfg.d_model) if cfg.placement in FINAL_NORM_PLACEMENTS else None
        self.rotary = RotaryEmbedding(cfg.d_k, cfg.n_position, cfg.rope_base) if cfg.positions == "rope" else None
        self.relative_attention_bias = (
            RelativePositionBias(cfg.n_head, cfg.n_position, cfg.relative_buckets, cfg.relative_max_distance,
                                 bidirectional) if cfg.positions == "relative" else None)
        self.scale_emb, self.d_model = cfg.scale_emb, cfg.d_model

    def _embed(self, seq: Tensor, emb: nn.Embedding, start: int | Tensor = 0) -> Tensor:
        x = emb(seq)
        if self.scale_emb:
            x = x * self.d_model ** 0.5
        if self.position_enc is not None:
            x = self.position_enc(x, start)
        x = self.dropout(x)
        return x if self.layer_norm is None else self.layer_norm(x)

    def _positions(self, x: Tensor, start: int | Tensor = 0, keys: int | Tensor | None = None
                   ) -> tuple[Tensor | None, Rotary | None]:
        """Self-attention's relative bias and RoPE tables for x (B, T, C) at positions start..start+T-1
        against `keys` keys (default start+T); None for models without them (sizes read only when needed, so
        the classic model's graphs stay exactly as they were)."""
        if self.rotary is None and self.relative_attention_bias is None:
            return None, None
        length = x.size(1)
        bias = None if self.relative_attention_bias is None else self.relative_attention_bias(
            start, length, start + length if keys is None else keys)
        return bias, None if self.rotary is None else self.rotary(start, length)

    def _final(self, x: Tensor) -> Tensor:
        return x if self.final_norm is None else self.final_norm(x)


class Encoder(Embedder):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.src_word_emb = nn.Embedding(cfg.src_vocab_size, cfg.d_model, padding_idx=cfg.src_pad_idx)
        self._build(cfg, EncoderLayer, bidirectional=True)

    def forward(self, src_seq: Tensor, src_mask: Tensor) -> Tensor:
        x = self._embed(src_seq, self.src_word_emb)  # (B, S, C)
        bias, rotary = self._positions(x)
        for layer in self.layer_stack:
            x = layer(x, slf_attn_mask=src_mask, bias=bias, rotary=rotary)
        return self._final(x)


class Decoder(Embedder):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.trg_word_emb = nn.Embedding(cfg.trg_vocab_size, cfg.d_model, padding_idx=cfg.trg_pad_idx)
        self._build(cfg, DecoderLayer, bidirectional=False)

    def forward(self, trg_seq: Tensor, trg_mask: Tensor, enc_output: Tensor, src_mask: Tensor) -> Tensor:
        x = self._embed(trg_seq, self.trg_word_emb)  # (B, T, C)
        bias, rotary = self._positions(x)
        for layer in self.layer_stack:
            x = layer(x, enc_output, slf_attn_mask=trg_mask, dec_enc_attn_mask=src_mask, bias=bias, rotary=rotary)
        return self._final(x)

    def cross_keys_values(self, enc_output: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every layer's cross-attention keys/values, computed once per source."""
        return [layer.enc_attn.keys_values(enc_output, enc_output) for layer in self.layer_stack]

    def step(self, trg_new: Tensor, cache: StepCache, cross: list[tuple[Tensor, Tensor]], src_mask: Tensor
             ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """New target tokens (B, T) after the cached ones -> output (B, T, C) and each layer's cache as the
        step leaves it (model.cache: grown by concatenation, or buffers written in place)."""
        start, keys = cache.start, cache.key_length(trg_new.size(1))
        x = self._embed(trg_new, self.trg_word_emb, start=start)
        mask = step_mask(start, trg_new.size(1), keys, trg_new.device)
        bias, rotary = self._positions(x, start, keys)
        for i, (layer, (ek, ev)) in enumerate(zip(self.layer_stack, cross, strict=True)):
            x = layer.step(x, cache, i, ek, ev, mask, src_mask, bias, rotary)
        return self._final(x), cache.present


class Transformer(nn.Module):
    """Seed semantics; forward returns logits (B, T, V) rather than the seed's flattened (B*T, V)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.src_pad_idx, self.trg_pad_idx = cfg.src_pad_idx, cfg.trg_pad_idx
        self.scale_prj, self.d_model = cfg.scale_prj, cfg.d_model
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.trg_word_prj = nn.Linear(cfg.d_model, cfg.trg_vocab_size, bias=cfg.output_bias)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        if cfg.output_bias:
            nn.init.zeros_(self.trg_word_prj.bias)
        self.tie_weights()

    def tie_weights(self) -> None:
        """The shared tables as one parameter: the projection the target embedding, and (shared vocabularies) the
        source embedding too."""
        if self.config.proj_share_weight:
            self.trg_word_prj.weight = self.decoder.trg_word_emb.weight
        if self.config.embs_share_weight:
            self.encoder.src_word_emb.weight = self.decoder.trg_word_emb.weight

    @classmethod
    def over(cls, cfg: ModelConfig, state: dict[str, Tensor]) -> Transformer:
        """The model whose weights are the given tensors themselves (a mapped checkpoint's pages: nothing copied,
        nothing initialised first), float32 where they are not; built on the meta device, its computed tables (RoPE,
        T5's buckets) then made on the CPU. The state must fit the config (checkpoint.validate_state_dict)."""
        with torch.device("meta"):
            model = cls(cfg)
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()},
                              assign=True)
        model.tie_weights()  # assigned one by one, the shared tables came apart
        for module in model.modules():
            if hasattr(module, "materialize"):
                module.materialize()
        return model.eval()

    def encode(self, src_seq: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S) ids -> encoder output (B, S, C) and source mask (B, 1, S)."""
        src_mask = get_pad_mask(src_seq, self.src_pad_idx)
        return self.encoder(src_seq, src_mask), src_mask

    def project(self, dec_output: Tensor) -> Tensor:
        """Decoder output -> logits (B, T, V); a logits bias is added after the scaling."""
        logits = F.linear(dec_output, self.trg_word_prj.weight)
        if self.scale_prj:
            logits = logits * self.d_model ** -0.5
        return logits if self.trg_word_prj.bias is None else logits + self.trg_word_prj.bias

    def forward(self, src_seq: Tensor, trg_seq: Tensor) -> Tensor:
        return self.decode(trg_seq, *self.encode(src_seq))

    def decode(self, trg_seq: Tensor, enc_output: Tensor, src_mask: Tensor) -> Tensor:
        """The full-sequence logits (B, T, V) over an encoder output already computed (encode's pair)."""
        trg_mask = get_pad_mask(trg_seq, self.trg_pad_idx) & get_subsequent_mask(trg_seq)
        trg_mask[:, :, 0] = True  # the start token is never padding, even where it is the pad id (Marian, T5)
        return self.project(self.decoder(trg_seq, trg_mask, enc_output, src_mask))
