"""An independent NumPy rendering of the Transformer variants' forward pass, reading a state_dict by name.

Written from the formulae docs/variants.md's table gives (RMSNorm, the four placements, gated FFNs,
RoPE on consecutive pairs, T5's relative position buckets), sharing no code with tfm_export, so the
tests can hold every option of the package's model to it. Classic options reduce it to seed_oracle.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from support.seed_oracle import _softmax

_erf = np.vectorize(math.erf)
ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0),
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "swish": lambda x: x / (1 + np.exp(-x)),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}
GATES = {"glu": "sigmoid", "geglu": "gelu", "swiglu": "swish"}


def t5_bucket(relative_position: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int):
    """T5's _relative_position_bucket, as its paper's reference code computes it (float32 logs)."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    if_large = max_exact + (torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
                            * (num_buckets - max_exact)).to(torch.long)
    if_large = torch.min(if_large, torch.full_like(if_large, num_buckets - 1))
    return buckets + torch.where(is_small, relative_position, if_large)


class VariantOracle:
    def __init__(self, state: dict[str, torch.Tensor], cfg: dict) -> None:
        self.p = {k: v.double().numpy() for k, v in state.items()}
        self.cfg = cfg

    def norm(self, prefix: str, x: np.ndarray) -> np.ndarray:
        w, eps = self.p[f"{prefix}.weight"], self.cfg["norm_eps"]
        if self.cfg["norm"] == "rmsnorm":
            return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + self.p[f"{prefix}.bias"]

    def sublayer(self, prefix: str, x: np.ndarray, f) -> np.ndarray:
        """f takes the sublayer's input (x, or its norm) and returns its output."""
        placement, ln = self.cfg["placement"], f"{prefix}.layer_norm"
        if placement == "post":
            return self.norm(ln, x + f(x))
        if placement == "deepnorm":
            return self.norm(ln, self.cfg["deepnorm_alpha"] * x + f(x))
        if placement == "pre":
            return x + f(self.norm(ln, x))
        return x + self.norm(f"{prefix}.sandwich_norm", f(self.norm(ln, x)))

    def linear(self, name: str, x: np.ndarray) -> np.ndarray:
        out = x @ self.p[f"{name}.weight"].T
        return out + self.p[f"{name}.bias"] if f"{name}.bias" in self.p else out

    def rope(self, x: np.ndarray) -> np.ndarray:
        """x: (B, H, T, d) at positions 0..T-1; pairs (2i, 2i+1) turned by pos * base^(-2i/d)."""
        d, out = x.shape[-1], x.copy()
        for pos in range(x.shape[2]):
            for i in range(d // 2):
                angle = pos * self.cfg["rope_base"] ** (-2 * i / d)
                c, s = math.cos(angle), math.sin(angle)
                a, b = x[:, :, pos, 2 * i], x[:, :, pos, 2 * i + 1]
                out[:, :, pos, 2 * i], out[:, :, pos, 2 * i + 1] = a * c - b * s, a * s + b * c
        return out

    def relative_bias(self, side: str, tq: int, tk: int) -> np.ndarray:
        relative = torch.arange(tk)[None, :] - torch.arange(tq)[:, None]
        buckets = t5_bucket(relative, side == "encoder", self.cfg["relative_buckets"],
                            self.cfg["relative_max_distance"]).numpy()
        return self.p[f"{side}.relative_attention_bias.weight"][buckets].transpose(2, 0, 1)  # (H, Tq, Tk)

    def attention(self, prefix: str, xq, xkv, mask, own: bool, bias=None) -> np.ndarray:
        b, tq, tk = xq.shape[0], xq.shape[1], xkv.shape[1]
        h, dk, dv = self.cfg["n_head"], self.cfg["d_k"], self.cfg["d_v"]
        q = self.linear(f"{prefix}.w_qs", xq).reshape(b, tq, h, dk).transpose(0, 2, 1, 3)
        k = self.linear(f"{prefix}.w_ks", xkv).reshape(b, tk, h, dk).transpose(0, 2, 1, 3)
        v = self.linear(f"{prefix}.w_vs", xkv).reshape(b, tk, h, dv).transpose(0, 2, 1, 3)
        if own and self.cfg["positions"] == "rope":
            q, k = self.rope(q), self.rope(k)
        scores = (q / math.sqrt(dk)) @ k.transpose(0, 1, 3, 2)
        if bias is not None:
            scores = scores + bias[None]
        scores = np.where(mask[:, None] == 0, -1e9, scores)
        out = (_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(b, tq, h * dv)
        return self.linear(f"{prefix}.fc", out)

    def ffn(self, prefix: str, x: np.ndarray) -> np.ndarray:
        act = self.cfg["activation"]
        hidden = ACTIVATIONS[GATES.get(act, act)](self.linear(f"{prefix}.w_1", x))
        if act in GATES:
            hidden = hidden * self.linear(f"{prefix}.w_3", x)
        return self.linear(f"{prefix}.w_2", hidden)

    def embed(self, side: str, table: str, ids: np.ndarray, scale: bool) -> np.ndarray:
        x = self.p[f"{side}.{table}.weight"][ids] * (math.sqrt(self.cfg["d_model"]) if scale else 1.0)
        if self.cfg["positions"] in ("sinusoid", "learned"):
            x = x + self.p[f"{side}.position_enc.pos_table"][:, :ids.shape[1]]
        return self.norm(f"{side}.layer_norm", x) if self.cfg["embedding_norm"] else x

    def final(self, side: str, x: np.ndarray) -> np.ndarray:
        return self.norm(f"{side}.final_norm", x) if self.cfg["placement"] in ("pre", "sandwich") else x

    def stack(self, side: str, x: np.ndarray, mask: np.ndarray, enc: np.ndarray | None = None,
              src_mask: np.ndarray | None = None) -> np.ndarray:
        """The encoder (enc None) or decoder layers over embedded x, then the final norm."""
        relative = self.cfg["positions"] == "relative"
        bias = self.relative_bias(side, x.shape[1], x.shape[1]) if relative else None
        for i in range(self.cfg["n_layers"]):
            pre = f"{side}.layer_stack.{i}"
            x = self.sublayer(f"{pre}.slf_attn", x, lambda h, p=pre: self.attention(
                f"{p}.slf_attn", h, h, mask, True, bias))
            if enc is not None:
                x = self.sublayer(f"{pre}.enc_attn", x, lambda h, p=pre: self.attention(
                    f"{p}.enc_attn", h, enc, src_mask, False))
            x = self.sublayer(f"{pre}.pos_ffn", x, lambda h, p=pre: self.ffn(f"{p}.pos_ffn", h))
        return self.final(side, x)

    def forward(self, src: np.ndarray, trg: np.ndarray) -> np.ndarray:
        """Logits (B, T, V) in float64; shared weights, scale_emb_or_prj 'emb' (tests use that)."""
        src_mask = (src != 1)[:, None, :].astype(np.int64)
        trg_mask = (trg != 1)[:, None, :] * np.tril(np.ones((trg.shape[1], trg.shape[1]), dtype=np.int64))[None]
        enc = self.stack("encoder", self.embed("encoder", "src_word_emb", src, True), src_mask)
        dec = self.stack("decoder", self.embed("decoder", "trg_word_emb", trg, True), trg_mask, enc, src_mask)
        return dec @ self.p["trg_word_prj.weight"].T
