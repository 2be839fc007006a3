"""What a search step takes besides tokens and cache, as both decoder_step_search backends feed it: the
decoding-rule inputs (token bias, forced token), kept up to date from the search's StepRule, and how decoder rows
group by source (the encoder's mask and keys/values come once per source)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.token_rules import TokenRules
from .step import StepRule


@dataclass
class Rules:
    """The decoding-rule inputs of a step: the (V,) token bias and the forced token (-1: none). `changed` says
    whether the last apply() altered them, so a device copy is refreshed only then."""

    bias: np.ndarray
    forced: np.ndarray = field(default_factory=lambda: np.full((), -1, np.int64))
    banned: tuple[int, ...] | None = None  # whose ids the bias holds at -inf
    changed: bool = True

    def apply(self, rule: StepRule) -> None:
        rules: TokenRules = rule.rules
        before = (self.banned, float(self.bias[rules.eos]), int(self.forced))
        if self.banned != rules.banned:
            self.bias[:] = 0
            self.bias[list(rules.banned)] = -np.inf
            self.banned = rules.banned
        self.bias[rules.eos] = -np.inf if not rule.allow_eos or rules.eos in rules.banned else 0.0
        self.forced[...] = -1 if rule.forced is None else rule.forced
        self.changed = before != (self.banned, float(self.bias[rules.eos]), int(self.forced))


def source_groups(sources: np.ndarray) -> tuple[np.ndarray, int]:
    """Each row's source -> the sources of consecutive equal-size groups and that size; rows that do not
    form such groups get one group each (their encoder keys/values are then repeated per row)."""
    starts = np.flatnonzero(np.diff(sources, prepend=-1) != 0)
    sizes = np.diff(starts, append=len(sources))
    if len(sizes) and (sizes == sizes[0]).all():
        return sources[starts], int(sizes[0])
    return sources, 1
