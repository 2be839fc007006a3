"""The position-wise feed-forward sublayer: the seed's `w_2(relu(w_1(x)))`, another activation, or a gated
unit with three matrices, `w_2(act(w_1(x)) * w_3(x))` (GLU: sigmoid, GeGLU: GELU, SwiGLU: Swish)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.variants import GATED_ACTIVATIONS
from .norms import SEED_STYLE, NormStyle, Residual

ACTIVATION_FUNCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,  # the erf form (exported as Erf: opset 17 has no Gelu op)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "swish": F.silu,
    "sigmoid": torch.sigmoid,
}


class PositionwiseFeedForward(Residual):
    def __init__(self, d_in: int, d_hid: int, dropout: float = 0.1, *, style: NormStyle = SEED_STYLE,
                 activation: str = "relu", bias: bool = True) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_in, d_hid, bias=bias)  # the activated (gate) projection
        self.w_2 = nn.Linear(d_hid, d_in, bias=bias)
        self.gated = activation in GATED_ACTIVATIONS
        if self.gated:
            self.w_3 = nn.Linear(d_in, d_hid, bias=bias)  # the linear (up) projection of a gated unit
        self.act = ACTIVATION_FUNCTIONS[GATED_ACTIVATIONS.get(activation, activation)]
        self._add_norms(d_in, style)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.sublayer_input(x)
        hidden = self.act(self.w_1(h)) * self.w_3(h) if self.gated else self.act(self.w_1(h))  # (B, T, d_hid)
        return self.residual(x, self.dropout(self.w_2(hidden)))
