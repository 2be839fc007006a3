"""Normalisation and where it sits around each sublayer's residual connection.

Every sublayer (attention, FFN) owns its norm under the seed's name `layer_norm`, whatever the
placement, so a post-norm checkpoint's names mean the same part in a pre-norm model:
- post (the seed): `norm(x + f(x))`
- deepnorm: `norm(alpha * x + f(x))` (alpha = 1 is post-norm)
- pre: `x + f(norm(x))` (the stacks end with a final norm)
- sandwich: `x + norm'(f(norm(x)))`, the second norm under the plain name `sandwich_norm`
RMSNorm is torch's own `nn.RMSNorm` (`x / sqrt(mean(x^2) + eps) * g`, no bias, no mean).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from ..core.config import ModelConfig


@dataclass(frozen=True)
class NormStyle:
    """Which norm a sublayer uses and where; the defaults are the seed's."""

    norm: str = "layernorm"
    eps: float = 1e-6
    placement: str = "post"
    alpha: float = 1.0  # deepnorm only

    @classmethod
    def of(cls, cfg: ModelConfig) -> NormStyle:
        return cls(cfg.norm, cfg.norm_eps, cfg.placement, cfg.deepnorm_alpha)


SEED_STYLE = NormStyle()  # LayerNorm eps 1e-6 after the residual


def make_norm(style: NormStyle, d_model: int) -> nn.Module:
    if style.norm == "rmsnorm":
        return nn.RMSNorm(d_model, eps=style.eps)
    return nn.LayerNorm(d_model, eps=style.eps)


class Residual(nn.Module):
    """Base of the sublayers: `sublayer_input` before f, `residual` after it, as the placement says."""

    def _add_norms(self, d_model: int, style: NormStyle) -> None:
        """Registered after the sublayer's own weights, as the seed orders its state_dict."""
        self.placement, self.alpha = style.placement, style.alpha
        self.layer_norm = make_norm(style, d_model)
        if style.placement == "sandwich":
            self.sandwich_norm = make_norm(style, d_model)

    def sublayer_input(self, x: Tensor) -> Tensor:
        return self.layer_norm(x) if self.placement in ("pre", "sandwich") else x

    def residual(self, x: Tensor, out: Tensor) -> Tensor:
        """x: the sublayer's input (the residual stream); out: f's output."""
        if self.placement == "post":
            return self.layer_norm(out + x)
        if self.placement == "deepnorm":
            return self.layer_norm(out + x * self.alpha)
        if self.placement == "sandwich":
            return self.sandwich_norm(out) + x
        return out + x
