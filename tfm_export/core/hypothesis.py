"""The result of decoding one input, shared by every decoder."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # generated ids, without <s> and </s>
    score: float  # sum of log-probabilities, </s> included when generated
    length_penalty: float = 1.0
    finished: bool = True  # ended with </s> (False: cut at max_length)

    @property
    def length(self) -> int:
        """Generated tokens, the final </s> included (what the length penalty divides by)."""
        return len(self.tokens) + (1 if self.finished else 0)

    @property
    def normalized_score(self) -> float:
        return self.score / max(self.length, 1) ** self.length_penalty
