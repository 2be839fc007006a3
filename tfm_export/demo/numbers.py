"""The demo task: English number words -> French number words for 0..999,999.

The held-out test numbers are a fixed seeded sample that training (and calibration) never see,
so the exact-match figure in README measures generalisation, not memory.
"""

from __future__ import annotations

import random
from functools import cache

from num2words import num2words

MAX_NUMBER = 999_999
HELD_OUT_SIZE = 1000
HELD_OUT_SEED = 20261122


def english(n: int) -> str:
    return num2words(n, lang="en")


def french(n: int) -> str:
    return num2words(n, lang="fr")


@cache
def held_out_numbers() -> tuple[int, ...]:
    """The 1,000 test numbers (a fixed sample above 1,000 so no small number is withheld)."""
    rng = random.Random(HELD_OUT_SEED)
    return tuple(rng.sample(range(1000, MAX_NUMBER + 1), HELD_OUT_SIZE))


# Training draws a magnitude first, so 4- and 5-digit numbers ("one thousand, ..." vs "one hundred
# thousand, ...") are not drowned by the 900,000 six-digit ones.
MAGNITUDES = ((0, 1000, 0.2), (1000, 10_000, 0.2), (10_000, 100_000, 0.2), (100_000, MAX_NUMBER + 1, 0.4))


def training_number(rng: random.Random) -> int:
    """A number for training, drawn by magnitude, never one of the held-out numbers."""
    held_out = _held_out_set()
    low, high, _ = rng.choices(MAGNITUDES, weights=[w for *_, w in MAGNITUDES])[0]
    while True:
        n = rng.randrange(low, high)
        if n not in held_out:
            return n


@cache
def _held_out_set() -> frozenset[int]:
    return frozenset(held_out_numbers())


def corpus_for_vocabulary() -> list[str]:
    """Texts that contain every word the task uses, for building the tokenizer."""
    numbers = list(range(0, 2000)) + list(range(0, MAX_NUMBER + 1, 1000))
    return [text for n in numbers for text in (english(n), french(n))]


def held_out_pairs() -> list[tuple[str, str]]:
    return [(english(n), french(n)) for n in held_out_numbers()]


def exact_match(hypotheses: list[str], references: list[str]) -> tuple[float, list[int]]:
    """Fraction of exactly equal strings, and the indices that differ."""
    misses = [i for i, (h, r) in enumerate(zip(hypotheses, references, strict=True)) if h != r]
    return 1 - len(misses) / len(references), misses
