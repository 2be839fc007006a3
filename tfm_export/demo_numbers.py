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


def training_number(rng: random.Random) -> int:
    """A number for training: a quarter below 1,000 (each is seen often), the rest uniform, never held out."""
    held_out = set(held_out_numbers())
    while True:
        n = rng.randrange(1000) if rng.random() < 0.25 else rng.randrange(MAX_NUMBER + 1)
        if n not in held_out:
            return n


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
