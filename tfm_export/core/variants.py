"""The Transformer variants: the option values each architectural choice takes, the classic model's
choice for each, and the named presets (`--preset`).

Every option is independent of the others; the classic values reproduce the seed's model exactly, so a
config that names only classic values is the seed's Transformer and serialises exactly as before the
options existed (old artifacts stay byte-identical; see ModelConfig.to_dict).
"""

from __future__ import annotations

import math
from typing import Any

NORMS = ("layernorm", "rmsnorm")
PLACEMENTS = ("post", "pre", "sandwich", "deepnorm")
# gelu is the erf form (BART, mBART); gelu_tanh the tanh approximation (T5 v1.1's "gelu_new").
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swish", "glu", "geglu", "geglu_tanh", "swiglu")
# gated FFN -> its gate's activation
GATED_ACTIVATIONS = {"glu": "sigmoid", "geglu": "gelu", "geglu_tanh": "gelu_tanh", "swiglu": "swish"}
POSITIONS = ("sinusoid", "learned", "rope", "relative")
# Placements whose residual stream is never normalised: they end each stack with a final norm.
FINAL_NORM_PLACEMENTS = ("pre", "sandwich")

CLASSIC: dict[str, Any] = {
    "norm": "layernorm",
    "norm_eps": 1e-6,
    "placement": "post",
    "deepnorm_alpha": 1.0,
    "embedding_norm": True,
    "activation": "relu",
    "ffn_bias": True,
    "attention_bias": False,
    "positions": "sinusoid",
    "rope_base": 10000.0,
    "relative_buckets": 32,
    "relative_max_distance": 128,
    "output_bias": False,
}
# Largest value of each integer option: a hostile config is refused instead of allocating a huge bias table.
INTEGER_LIMITS = {"relative_buckets": 1 << 12, "relative_max_distance": 1 << 16}
CHOICES = {"norm": NORMS, "placement": PLACEMENTS, "activation": ACTIVATIONS, "positions": POSITIONS}
# Options that only mean something under one value of another option: (option, value it needs).
APPLIES_WITH = {"deepnorm_alpha": ("placement", "deepnorm"), "rope_base": ("positions", "rope"),
                "relative_buckets": ("positions", "relative"), "relative_max_distance": ("positions", "relative")}

PRESETS: dict[str, dict[str, Any]] = {
    "classic": {},
    # pre-norm + RMSNorm + SwiGLU + RoPE, no embedding norm, no biases (as LLaMA-era models are built)
    "modern": {"norm": "rmsnorm", "placement": "pre", "embedding_norm": False, "activation": "swiglu",
               "ffn_bias": False, "positions": "rope"},
    # T5 v1.1: pre-norm + RMSNorm + GeGLU + bucketed relative position bias, no embedding norm, no biases
    "t5": {"norm": "rmsnorm", "placement": "pre", "embedding_norm": False, "activation": "geglu",
           "ffn_bias": False, "positions": "relative"},
}


def variant_values(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Every variant option: the classic value, replaced by the preset's, replaced by `overrides`."""
    unknown = sorted(set(overrides) - set(CLASSIC))
    if preset not in PRESETS or unknown:
        raise ValueError(f"unknown preset {preset!r} or options {unknown}")
    return {**CLASSIC, **PRESETS[preset], **overrides}


def variant_problems(values: dict[str, Any], d_k: int) -> list[str]:
    """What is wrong with the variant options of one config, every problem in one list."""
    found = [f"{name} must be one of {', '.join(choices)}, got {values[name]!r}"
             for name, choices in CHOICES.items() if values[name] not in choices]
    found += [f"{name} must be true or false, got {values[name]!r}"
              for name in ("embedding_norm", "ffn_bias", "attention_bias", "output_bias")
              if not isinstance(values[name], bool)]
    found += [f"{name} must be a positive finite number, got {values[name]!r}"
              for name in ("norm_eps", "deepnorm_alpha", "rope_base")
              if isinstance(values[name], bool) or not isinstance(values[name], int | float)
              or not 0 < values[name] < math.inf]
    found += [f"{name} must be a whole number in 1..{limit:,}, got {values[name]!r}"
              for name, limit in INTEGER_LIMITS.items()
              if isinstance(values[name], bool) or not isinstance(values[name], int) or not 1 <= values[name] <= limit]
    found += [f"{name} only applies with {option} '{needed}' (this config has {option} {values[option]!r}); "
              "leave it at its default" for name, (option, needed) in APPLIES_WITH.items()
              if values[option] != needed and values[name] != CLASSIC[name]]
    if found:
        return found
    if values["positions"] == "rope" and d_k % 2:
        found.append(f"RoPE rotates pairs of dimensions, so the head size d_k must be even (got {d_k})")
    if values["positions"] == "relative" and (values["relative_buckets"] < 4 or values["relative_buckets"] % 2):
        found.append("relative_buckets must be even and at least 4 (half of them per direction in the encoder, "
                     f"half of those exact distances), got {values['relative_buckets']}")
    elif values["positions"] == "relative" and values["relative_max_distance"] <= values["relative_buckets"] // 2:
        found.append(f"relative_max_distance ({values['relative_max_distance']}) must exceed half of "
                     f"relative_buckets ({values['relative_buckets'] // 2})")
    return found


def describe(values: dict[str, Any]) -> str:
    """One line naming every option that differs from the classic model ('classic' when none does)."""
    changed = [f"{name}={values[name]}" for name in CLASSIC if values[name] != CLASSIC[name]]
    return ", ".join(changed) or "classic"
