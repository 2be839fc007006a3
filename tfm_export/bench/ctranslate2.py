"""checkpoint -> CTranslate2 model directory, through CTranslate2's own Converter and spec API.

CTranslate2 is the benchmark's external anchor, so it must run exactly this model: the seed's own
interleaved sinusoid table (CT2's built-in one differs) or the learned table, the norm's eps, x sqrt(d_model)
on embeddings only with scale_emb_or_prj='emb', and the d_model^-0.5 logit scale of 'prj' folded into the
output projection. Self-attention Q/K/V are stacked into one linear, cross-attention K/V into another, as
the spec expects. The variants map onto the spec's own options: pre_norm (with final norms), rms_norm,
layernorm_embedding, the activation and ffn_glu (w_1 = linear_0, w_3 = linear_0_noact), RoPE as
rotary_dim 0 (every dimension) with rotary_interleave (consecutive pairs) and rotary_base, T5's
relative_attention_bias, and sandwich norms as pre_post_layer_norm. DeepNorm's alpha * x residual has no
spec field: `unsupported` says so and the benchmark's CTranslate2 rows carry that reason.

A Hugging Face directory goes through the same spec (its model is a member of the family), with its
final_logits_bias and its own start and end tokens, not through CTranslate2's TransformersConverter: that one
starts Marian's decoder from a zero vector, as Marian NMT does, which is not the function transformers computes
(on a random Marian its greedy outputs matched generate()'s on none of 16 inputs).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..core.config import ModelConfig
from ..core.errors import TfmExportError
from ..core.token_rules import SEED_RULES
from ..core.variants import GATED_ACTIVATIONS
from ..model.checkpoint import Checkpoint

ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH", "sigmoid": "Sigmoid"}  # ours -> CT2's Activation


def unsupported(cfg: ModelConfig) -> str | None:
    """Why CTranslate2's spec cannot express this model, or None."""
    if cfg.d_k * cfg.n_head != cfg.d_model or cfg.d_v * cfg.n_head != cfg.d_model:
        return (f"CTranslate2 needs d_k = d_v = d_model / n_head (this model has d_k {cfg.d_k}, d_v {cfg.d_v}, "
                f"d_model {cfg.d_model}, {cfg.n_head} heads)")
    if cfg.placement == "deepnorm":
        return "CTranslate2's spec cannot express DeepNorm (no residual scale alpha)"
    return None


def _require_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise TfmExportError("CTranslate2 is not installed; pip install 'tfm-export[bench]'") from None
    return ctranslate2


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _norm(spec, norm: torch.nn.Module) -> None:
    spec.gamma = _array(norm.weight)
    if getattr(norm, "bias", None) is not None:  # LayerNorm; RMSNorm has none
        spec.beta = _array(norm.bias)


def _linear(spec, *layers: torch.nn.Linear) -> None:
    """One CT2 linear from one or more stacked torch linears (rows concatenated)."""
    spec.weight = np.concatenate([_array(layer.weight) for layer in layers])
    if layers[0].bias is not None:
        spec.bias = np.concatenate([_array(layer.bias) for layer in layers])


# CT2's names for a sublayer's two norms when they are sandwiched (the layer's, not the sublayer's)
SANDWICH_NORMS = {"self_attention": ("input_layer_norm", "post_attention_layer_norm"),
                  "attention": ("external_pre_encoder_attention_layer_norm",
                                "external_post_encoder_attention_layer_norm"),
                  "ffn": ("pre_feedforward_layer_norm", "post_feedforward_layer_norm")}


def _sublayer_norms(layer_spec, part: str, sublayer, sandwich: bool) -> None:
    if sandwich:
        before, after = SANDWICH_NORMS[part]
        _norm(getattr(layer_spec, before), sublayer.layer_norm)
        _norm(getattr(layer_spec, after), sublayer.sandwich_norm)
    else:
        _norm(getattr(layer_spec, part).layer_norm, sublayer.layer_norm)


def _ffn(layer_spec, ffn, sandwich: bool) -> None:
    _linear(layer_spec.ffn.linear_0, ffn.w_1)
    _linear(layer_spec.ffn.linear_1, ffn.w_2)
    if ffn.gated:
        _linear(layer_spec.ffn.linear_0_noact, ffn.w_3)
    _sublayer_norms(layer_spec, "ffn", ffn, sandwich)


def _self_attention(layer_spec, attn, sandwich: bool, relative) -> None:
    spec = layer_spec.self_attention
    _linear(spec.linear[0], attn.w_qs, attn.w_ks, attn.w_vs)
    _linear(spec.linear[1], attn.fc)
    _sublayer_norms(layer_spec, "self_attention", attn, sandwich)
    if relative is not None:  # the stack's one bias table, given to every layer as CT2 wants it
        spec.relative_attention_bias = _array(relative.weight)
        spec.relative_attention_max_distance = np.dtype("int32").type(relative.max_distance)


def _cross_attention(layer_spec, attn, sandwich: bool) -> None:
    spec = layer_spec.attention
    _linear(spec.linear[0], attn.w_qs)
    _linear(spec.linear[1], attn.w_ks, attn.w_vs)
    _linear(spec.linear[2], attn.fc)
    _sublayer_norms(layer_spec, "attention", attn, sandwich)


def _embeddings(side_spec, embedder, scale: bool) -> None:
    side_spec.scale_embeddings = scale
    if embedder.position_enc is not None:
        side_spec.position_encodings.encodings = _array(embedder.position_enc.pos_table[0])
    elif hasattr(side_spec, "position_encodings"):  # RoPE: positions come from the attention alone
        del side_spec.position_encodings
    if embedder.layer_norm is not None:
        _norm(side_spec.layernorm_embedding, embedder.layer_norm)
    if embedder.final_norm is not None:
        _norm(side_spec.layer_norm, embedder.final_norm)


def _stack_specs(ct2, cfg: ModelConfig):
    """Encoder and decoder specs with the variant's options."""
    sandwich = cfg.placement == "sandwich"
    act = ACTIVATIONS[GATED_ACTIVATIONS.get(cfg.activation, cfg.activation)]
    common = dict(pre_norm=cfg.placement in ("pre", "sandwich"), activation=getattr(ct2.specs.Activation, act),
                  layernorm_embedding=cfg.embedding_norm, relative_attention_bias=cfg.positions == "relative",
                  ffn_glu=cfg.activation in GATED_ACTIVATIONS, rms_norm=cfg.norm == "rmsnorm",
                  pre_post_layer_norm=sandwich)
    if cfg.positions == "rope":  # every dimension, consecutive pairs
        common.update(rotary_dim=0, rotary_interleave=True, rotary_base=cfg.rope_base)
    return (ct2.specs.TransformerEncoderSpec(cfg.n_layers, cfg.n_head, **common),
            ct2.specs.TransformerDecoderSpec(cfg.n_layers, cfg.n_head, external_pre_post_encoder_layers=sandwich,
                                             **common))


def _special_tokens(config, ckpt: Checkpoint) -> None:
    """The seed's sources get <s>/</s> from CTranslate2; a pretrained model's come framed by its own tokenizer,
    and its decoder starts and stops at the ids its generation config names."""
    if ckpt.rules == SEED_RULES:
        config.add_source_bos = config.add_source_eos = True
        return
    target = ckpt.vocab.target.tokenizer
    config.add_source_bos = config.add_source_eos = False
    config.decoder_start_token = config.bos_token = target.id_to_token(ckpt.rules.start)
    config.eos_token = target.id_to_token(ckpt.rules.eos)


def build_spec(ckpt: Checkpoint):
    """The TransformerSpec holding this checkpoint's weights."""
    ct2 = _require_ctranslate2()
    cfg, model = ckpt.config, ckpt.model
    reason = unsupported(cfg)
    if reason:
        raise TfmExportError(f"{ckpt.path}: {reason}")
    spec = ct2.specs.TransformerSpec(*_stack_specs(ct2, cfg))
    spec.config.layer_norm_epsilon = cfg.norm_eps
    _special_tokens(spec.config, ckpt)
    sandwich = cfg.placement == "sandwich"
    encoder, decoder = model.encoder, model.decoder
    spec.encoder.embeddings[0].weight = _array(encoder.src_word_emb.weight)
    _embeddings(spec.encoder, encoder, cfg.scale_emb)
    for layer_spec, layer in zip(spec.encoder.layer, encoder.layer_stack, strict=True):
        _self_attention(layer_spec, layer.slf_attn, sandwich, encoder.relative_attention_bias)
        _ffn(layer_spec, layer.pos_ffn, sandwich)
    spec.decoder.embeddings.weight = _array(decoder.trg_word_emb.weight)
    _embeddings(spec.decoder, decoder, cfg.scale_emb)
    for layer_spec, layer in zip(spec.decoder.layer, decoder.layer_stack, strict=True):
        _self_attention(layer_spec, layer.slf_attn, sandwich, decoder.relative_attention_bias)
        _cross_attention(layer_spec, layer.enc_attn, sandwich)
        _ffn(layer_spec, layer.pos_ffn, sandwich)
    projection = _array(model.trg_word_prj.weight)
    spec.decoder.projection.weight = projection * cfg.d_model ** -0.5 if cfg.scale_prj else projection
    if model.trg_word_prj.bias is not None:  # final_logits_bias, added after any scale
        spec.decoder.projection.bias = _array(model.trg_word_prj.bias)
    spec.register_source_vocabulary(_padded(ckpt.vocab.source.tokens(), cfg.src_vocab_size))
    spec.register_target_vocabulary(_padded(ckpt.vocab.target.tokens(), cfg.trg_vocab_size))
    return spec


def _padded(tokens: list[str], rows: int) -> list[str]:
    """A token for every embedding row, as CTranslate2 requires: a table larger than its tokenizer (M2M100's,
    padded past the language codes) gets fillers, as CTranslate2's own converters add them (never produced)."""
    return tokens + [f"madeupword{i:04d}" for i in range(rows - len(tokens))]


def convert_to_ctranslate2(ckpt: Checkpoint, output: Path) -> Path:
    """A float32 CTranslate2 model directory (int8 is chosen when loading, as compute_type)."""
    ct2 = _require_ctranslate2()

    class _CheckpointConverter(ct2.converters.Converter):
        def _load(self):
            return build_spec(ckpt)

    try:
        return Path(_CheckpointConverter().convert(str(output), force=True))
    except (OSError, ValueError, RuntimeError) as exc:
        raise TfmExportError(f"{output}: CTranslate2 conversion failed ({exc})") from None
