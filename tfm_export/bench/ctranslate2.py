"""checkpoint -> CTranslate2 model directory, through CTranslate2's own Converter and spec API.

CTranslate2 is the benchmark's external anchor, so it must run exactly this model: post-norm
layers, one LayerNorm after embedding + positions, the seed's own interleaved sinusoid table (CT2's
built-in one differs), eps 1e-6, x sqrt(d_model) on embeddings only with scale_emb_or_prj='emb', and
the d_model^-0.5 logit scale of 'prj' folded into the output projection. Self-attention Q/K/V are
stacked into one linear, cross-attention K/V into another, as the spec expects.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..core.errors import TfmExportError
from ..model.checkpoint import Checkpoint


def _require_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise TfmExportError("CTranslate2 is not installed; pip install 'tfm-export[bench]'") from None
    return ctranslate2


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _layer_norm(spec, ln: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(ln.weight), _array(ln.bias)


def _linear(spec, *layers: torch.nn.Linear) -> None:
    """One CT2 linear from one or more stacked torch linears (rows concatenated)."""
    spec.weight = np.concatenate([_array(layer.weight) for layer in layers])
    if layers[0].bias is not None:
        spec.bias = np.concatenate([_array(layer.bias) for layer in layers])


def _ffn(spec, ffn) -> None:
    _linear(spec.linear_0, ffn.w_1)
    _linear(spec.linear_1, ffn.w_2)
    _layer_norm(spec.layer_norm, ffn.layer_norm)


def _embeddings(side_spec, embedder, scale: bool) -> None:
    side_spec.scale_embeddings = scale
    side_spec.position_encodings.encodings = _array(embedder.position_enc.pos_table[0])
    _layer_norm(side_spec.layernorm_embedding, embedder.layer_norm)


def build_spec(ckpt: Checkpoint):
    """The TransformerSpec holding this checkpoint's weights."""
    ct2 = _require_ctranslate2()
    cfg, model = ckpt.config, ckpt.model
    if cfg.d_k * cfg.n_head != cfg.d_model or cfg.d_v * cfg.n_head != cfg.d_model:
        raise TfmExportError(f"{ckpt.path}: CTranslate2 needs d_k = d_v = d_model / n_head (this model has "
                             f"d_k {cfg.d_k}, d_v {cfg.d_v}, d_model {cfg.d_model}, {cfg.n_head} heads)")
    spec = ct2.specs.TransformerSpec.from_config((cfg.n_layers, cfg.n_layers), cfg.n_head, pre_norm=False,
                                                 layernorm_embedding=True)
    spec.config.layer_norm_epsilon = 1e-6
    spec.config.add_source_bos = spec.config.add_source_eos = True
    encoder, decoder = model.encoder, model.decoder
    spec.encoder.embeddings[0].weight = _array(encoder.src_word_emb.weight)
    _embeddings(spec.encoder, encoder, cfg.scale_emb)
    for layer_spec, layer in zip(spec.encoder.layer, encoder.layer_stack, strict=True):
        attn = layer.slf_attn
        _linear(layer_spec.self_attention.linear[0], attn.w_qs, attn.w_ks, attn.w_vs)
        _linear(layer_spec.self_attention.linear[1], attn.fc)
        _layer_norm(layer_spec.self_attention.layer_norm, attn.layer_norm)
        _ffn(layer_spec.ffn, layer.pos_ffn)
    spec.decoder.embeddings.weight = _array(decoder.trg_word_emb.weight)
    _embeddings(spec.decoder, decoder, cfg.scale_emb)
    for layer_spec, layer in zip(spec.decoder.layer, decoder.layer_stack, strict=True):
        own, cross = layer.slf_attn, layer.enc_attn
        _linear(layer_spec.self_attention.linear[0], own.w_qs, own.w_ks, own.w_vs)
        _linear(layer_spec.self_attention.linear[1], own.fc)
        _layer_norm(layer_spec.self_attention.layer_norm, own.layer_norm)
        _linear(layer_spec.attention.linear[0], cross.w_qs)
        _linear(layer_spec.attention.linear[1], cross.w_ks, cross.w_vs)
        _linear(layer_spec.attention.linear[2], cross.fc)
        _layer_norm(layer_spec.attention.layer_norm, cross.layer_norm)
        _ffn(layer_spec.ffn, layer.pos_ffn)
    projection = _array(model.trg_word_prj.weight)
    spec.decoder.projection.weight = projection * cfg.d_model ** -0.5 if cfg.scale_prj else projection
    spec.register_source_vocabulary(ckpt.vocab.source.tokens())
    spec.register_target_vocabulary(ckpt.vocab.target.tokens())
    return spec


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
