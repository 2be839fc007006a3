"""Exact match of a translator on the 1,000 held-out demo numbers (what `tfm-export eval-demo` prints)."""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.translator import DecodeOptions, Translator
from . import numbers as demo_numbers


@dataclass(frozen=True)
class DemoScore:
    exact_match: float
    pairs: list[tuple[str, str]]  # (english, french) held-out numbers
    outputs: list[str]
    misses: list[int]  # indices into pairs
    decoding: str  # "greedy" or "beam N"

    def lines(self, show_misses: int) -> list[str]:
        total = len(self.pairs)
        lines = [f"exact match: {100 * self.exact_match:.1f}% ({total - len(self.misses)}/{total}) "
                 f"held-out numbers, {self.decoding}"]
        return lines + [f"  {self.pairs[i][0]!r} -> {self.outputs[i]!r} (expected {self.pairs[i][1]!r})"
                        for i in self.misses[:show_misses]]


def evaluate_demo(translator: Translator, beam_size: int = 1) -> DemoScore:
    pairs = demo_numbers.held_out_pairs()
    results = translator.translate([en for en, _ in pairs], DecodeOptions(beam_size=beam_size, batch_size=100))
    outputs = [r.text for r in results]
    score, misses = demo_numbers.exact_match(outputs, [fr for _, fr in pairs])
    return DemoScore(score, pairs, outputs, misses, "greedy" if beam_size == 1 else f"beam {beam_size}")
