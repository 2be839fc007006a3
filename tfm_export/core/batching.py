"""Turning id lists into padded batches, grouped by length so little padding is computed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from .tokenizer import PAD_ID


def pad_batch(seqs: Sequence[Sequence[int]], pad: int = PAD_ID) -> np.ndarray:
    """(B, T) int64, right-padded with `pad` (the seed's <blank> by default)."""
    out = np.full((len(seqs), max(map(len, seqs))), pad, dtype=np.int64)
    for row, seq in enumerate(seqs):
        out[row, :len(seq)] = seq
    return out


def length_buckets(lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
    """Indices sorted by length and cut into batches (CTranslate2-style reordering)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]
