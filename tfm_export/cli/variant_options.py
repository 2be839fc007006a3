"""The architecture options shared by `random-checkpoint` and `train-demo`: a preset, then single flags.

Values are checked by the model config (one line, exit 1) rather than by click, so a wrong value reads
the same whether it comes from a flag or from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..core.variants import ACTIVATIONS, GATED_ACTIVATIONS, NORMS, PLACEMENTS, POSITIONS, PRESETS, variant_values

_FLAGS = [
    click.option("--preset", type=click.Choice(sorted(PRESETS)), default="classic", show_default=True,
                 help="classic: the seed's model. modern: pre-norm + RMSNorm + SwiGLU + RoPE, no embedding norm, "
                      "no FFN biases. t5: pre-norm + RMSNorm + GeGLU + relative position bias, no embedding "
                      "norm, no FFN biases. The flags below change single options of the preset."),
    click.option("--norm", default=None, help=f"{' | '.join(NORMS)}."),
    click.option("--norm-eps", type=float, default=None, help="Epsilon of every norm (classic 1e-6)."),
    click.option("--placement", default=None,
                 help=f"{' | '.join(PLACEMENTS)}: norm(x + f(x)) | x + f(norm(x)) with final norms | "
                      "x + norm(f(norm(x))) with final norms | norm(alpha x + f(x))."),
    click.option("--deepnorm-alpha", type=float, default=None,
                 help="alpha of --placement deepnorm (default there: (2 x layers)^(1/4), DeepNet's value)."),
    click.option("--embedding-norm/--no-embedding-norm", default=None,
                 help="The seed's norm after embedding + positions."),
    click.option("--activation", default=None,
                 help=f"FFN activation: {' | '.join(ACTIVATIONS)} ({', '.join(GATED_ACTIVATIONS)} gated, with "
                      "three matrices; the _tanh forms use GELU's tanh approximation)."),
    click.option("--ffn-bias/--no-ffn-bias", default=None, help="Biases in the FFN's linears (classic: on)."),
    click.option("--attention-bias/--no-attention-bias", default=None,
                 help="Biases in the attention projections (classic: off)."),
    click.option("--output-bias/--no-output-bias", default=None,
                 help="A bias on the logits (classic: off; Marian's and BART's final_logits_bias)."),
    click.option("--positions", default=None,
                 help=f"{' | '.join(POSITIONS)}: fixed table | learned table | RoPE on self-attention q/k | "
                      "T5 bucketed relative bias."),
    click.option("--rope-base", type=float, default=None, help="RoPE base (default 10000)."),
    click.option("--relative-buckets", type=int, default=None, help="Relative-bias buckets (default 32)."),
    click.option("--relative-max-distance", type=int, default=None,
                 help="Distance from which all keys share the last bucket (default 128)."),
]


def variant_options(command: Callable) -> Callable:
    """Adds the preset and every single-option flag; the command receives them as **variant."""
    for option in reversed(_FLAGS):
        command = option(command)
    return command


def variant_from_flags(flags: dict[str, Any], n_layers: int) -> dict[str, Any]:
    """The variant options a command's flags ask for (the preset, then each flag given)."""
    values = variant_values(flags.pop("preset"), {k: v for k, v in flags.items() if v is not None})
    if values["placement"] == "deepnorm" and flags.get("deepnorm_alpha") is None:
        values["deepnorm_alpha"] = (2 * n_layers) ** 0.25
    return values
