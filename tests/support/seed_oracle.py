"""An independent NumPy rendering of the seed code's forward pass, reading a state_dict by name.

Written from the seed's documented semantics, sharing no code with tfm_export, so tests can check
the package's model against it. Also builds seed-format state_dicts from the documented key names.
"""

from __future__ import annotations

import math
from argparse import Namespace

import numpy as np
import torch


def seed_settings(**overrides) -> Namespace:
    """What the seed's train.py leaves in `settings` (plus a few fields it has that we ignore)."""
    base = dict(src_vocab_size=11, trg_vocab_size=11, src_pad_idx=1, trg_pad_idx=1, d_model=8,
                d_word_vec=8, d_inner_hid=16, d_k=3, d_v=5, n_head=2, n_layers=2, dropout=0.1,
                proj_share_weight=True, embs_share_weight=True, scale_emb_or_prj="prj",
                epoch=10, batch_size=2048, label_smoothing=True, cuda=False, no_cuda=True,
                max_token_seq_len=100, save_model=None, save_mode="best")
    base.update(overrides)
    return Namespace(**base)


def hand_pos_table(n_position: int, d: int) -> torch.Tensor:
    rows = [[pos / math.pow(10000, 2 * (j // 2) / d) for j in range(d)] for pos in range(n_position)]
    table = [[math.sin(a) if j % 2 == 0 else math.cos(a) for j, a in enumerate(row)] for row in rows]
    return torch.tensor(table, dtype=torch.float32).unsqueeze(0)


def seed_state_dict(opt: Namespace, seed: int = 0, n_position: int = 200) -> dict[str, torch.Tensor]:
    """Random weights under the seed's parameter names and shapes."""
    rng = np.random.default_rng(seed)  # NumPy's generator: the same numbers on every CPU (torch.randn's are not)
    d, di, h, dk, dv = opt.d_model, opt.d_inner_hid, opt.n_head, opt.d_k, opt.d_v
    sd: dict[str, torch.Tensor] = {}

    def rand(*shape, scale=0.5):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))

    def norm(prefix):
        sd[f"{prefix}.layer_norm.weight"] = 1 + rand(d, scale=0.1)
        sd[f"{prefix}.layer_norm.bias"] = rand(d, scale=0.1)

    def mha(prefix):
        sd[f"{prefix}.w_qs.weight"] = rand(h * dk, d)
        sd[f"{prefix}.w_ks.weight"] = rand(h * dk, d)
        sd[f"{prefix}.w_vs.weight"] = rand(h * dv, d)
        sd[f"{prefix}.fc.weight"] = rand(d, h * dv)
        norm(prefix)

    def ffn(prefix):
        sd[f"{prefix}.w_1.weight"], sd[f"{prefix}.w_1.bias"] = rand(di, d), rand(di)
        sd[f"{prefix}.w_2.weight"], sd[f"{prefix}.w_2.bias"] = rand(d, di), rand(d)
        norm(prefix)

    sd["encoder.src_word_emb.weight"] = rand(opt.src_vocab_size, d)
    sd["encoder.position_enc.pos_table"] = hand_pos_table(n_position, d)
    for i in range(opt.n_layers):
        mha(f"encoder.layer_stack.{i}.slf_attn")
        ffn(f"encoder.layer_stack.{i}.pos_ffn")
    norm("encoder")
    sd["decoder.trg_word_emb.weight"] = rand(opt.trg_vocab_size, d)
    sd["decoder.position_enc.pos_table"] = hand_pos_table(n_position, d)
    for i in range(opt.n_layers):
        mha(f"decoder.layer_stack.{i}.slf_attn")
        mha(f"decoder.layer_stack.{i}.enc_attn")
        ffn(f"decoder.layer_stack.{i}.pos_ffn")
    norm("decoder")
    sd["trg_word_prj.weight"] = rand(opt.trg_vocab_size, d)
    if opt.proj_share_weight:
        sd["trg_word_prj.weight"] = sd["decoder.trg_word_emb.weight"]
    if opt.embs_share_weight:
        sd["encoder.src_word_emb.weight"] = sd["decoder.trg_word_emb.weight"]
    return sd


def _ln(x, w, b, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _mha(p, prefix, xq, xkv, mask, opt):
    """mask: (B, Tq|1, Tk) of 0/1."""
    w = lambda name: p[f"{prefix}.{name}"]  # noqa: E731
    b, tq, tk = xq.shape[0], xq.shape[1], xkv.shape[1]
    h, dk, dv = opt.n_head, opt.d_k, opt.d_v
    q = (xq @ w("w_qs.weight").T).reshape(b, tq, h, dk).transpose(0, 2, 1, 3)
    k = (xkv @ w("w_ks.weight").T).reshape(b, tk, h, dk).transpose(0, 2, 1, 3)
    v = (xkv @ w("w_vs.weight").T).reshape(b, tk, h, dv).transpose(0, 2, 1, 3)
    scores = (q / math.sqrt(dk)) @ k.transpose(0, 1, 3, 2)
    scores = np.where(mask[:, None] == 0, -1e9, scores)
    out = (_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(b, tq, h * dv)
    return _ln(out @ w("fc.weight").T + xq, w("layer_norm.weight"), w("layer_norm.bias"))


def _ffn(p, prefix, x):
    w = lambda name: p[f"{prefix}.{name}"]  # noqa: E731
    hidden = np.maximum(x @ w("w_1.weight").T + w("w_1.bias"), 0)
    return _ln(hidden @ w("w_2.weight").T + w("w_2.bias") + x, w("layer_norm.weight"), w("layer_norm.bias"))


def seed_forward(state: dict[str, torch.Tensor], opt: Namespace, src: np.ndarray, trg: np.ndarray) -> np.ndarray:
    """Logits (B, T, V) as the seed's Transformer.forward computes them (before its flattening), in float64."""
    p = {k: v.double().numpy() for k, v in state.items()}
    scale_emb = opt.proj_share_weight and opt.scale_emb_or_prj == "emb"
    scale_prj = opt.proj_share_weight and opt.scale_emb_or_prj == "prj"
    src_mask = (src != opt.src_pad_idx)[:, None, :].astype(np.int64)
    causal = np.tril(np.ones((trg.shape[1], trg.shape[1]), dtype=np.int64))[None]
    trg_mask = (trg != opt.trg_pad_idx)[:, None, :] * causal

    def embed(side, emb, ids):
        x = p[f"{side}.{emb}.weight"][ids] * (math.sqrt(opt.d_model) if scale_emb else 1.0)
        x = x + p[f"{side}.position_enc.pos_table"][:, :ids.shape[1]]
        return _ln(x, p[f"{side}.layer_norm.weight"], p[f"{side}.layer_norm.bias"])

    enc = embed("encoder", "src_word_emb", src)
    for i in range(opt.n_layers):
        enc = _mha(p, f"encoder.layer_stack.{i}.slf_attn", enc, enc, src_mask, opt)
        enc = _ffn(p, f"encoder.layer_stack.{i}.pos_ffn", enc)
    dec = embed("decoder", "trg_word_emb", trg)
    for i in range(opt.n_layers):
        dec = _mha(p, f"decoder.layer_stack.{i}.slf_attn", dec, dec, trg_mask, opt)
        dec = _mha(p, f"decoder.layer_stack.{i}.enc_attn", dec, enc, src_mask, opt)
        dec = _ffn(p, f"decoder.layer_stack.{i}.pos_ffn", dec)
    logits = dec @ p["trg_word_prj.weight"].T
    return logits * opt.d_model ** -0.5 if scale_prj else logits


def save_seed_checkpoint(path, opt: Namespace, state: dict[str, torch.Tensor], epoch: int = 7) -> None:
    """The dict the seed's train.py writes with torch.save."""
    torch.save({"epoch": epoch, "settings": opt, "model": state}, path)


def seed_vocab(size: int) -> list[str]:
    return ["<unk>", "<blank>", "<s>", "</s>"] + [f"w{i}" for i in range(size - 4)]
