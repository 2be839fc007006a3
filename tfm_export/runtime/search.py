"""The one search interface the Translator calls: a batch of sources in, each one's n best hypotheses out.

Two kinds of searcher exist. The loop searcher drives any StepBackend with the loops of `decoding` (greedy, the
reference's beam search, or generate()'s for pretrained models); generate.onnx searches inside one ONNX Runtime
call (runtime.backends.generate). Which one a model gets is decided once, where it is opened (runtime.backends).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..core.hypothesis import Hypothesis
from ..core.token_rules import TokenRules
from . import decoding
from .step import StepBackend


@dataclass(frozen=True)
class SearchOptions:
    max_length: int  # generated tokens at most
    beam_size: int = 1  # 1 = greedy
    length_penalty: float = 1.0
    n_best: int = 1  # hypotheses returned per input (<= beam_size)
    min_length: int = 0  # </s> barred before this many tokens (benchmarks force equal work with min = max)


class Searcher(Protocol):
    def search(self, src: np.ndarray, options: SearchOptions, rules: TokenRules) -> list[list[Hypothesis]]:
        """(B, S) right-padded source ids -> each input's n_best hypotheses, best first, under the model's rules
        (special ids, forced tokens, the beam rule; a language choice changes them)."""


@dataclass
class LoopSearcher:
    """The decoding loops over a step backend."""

    backend: StepBackend

    def search(self, src: np.ndarray, options: SearchOptions, rules: TokenRules) -> list[list[Hypothesis]]:
        if options.beam_size == 1:
            return [[h] for h in decoding.greedy(self.backend, src, options.max_length, options.min_length, rules)]
        return decoding.beam_search_for(rules)(self.backend, src, options.beam_size, options.max_length,
                                               options.length_penalty, options.n_best, options.min_length, rules)
