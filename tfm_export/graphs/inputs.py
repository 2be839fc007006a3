"""Generated model inputs for checks and smoke tests: padded source batches and target prefixes of
ordinary tokens, NumPy only (quantize and check use them without PyTorch)."""

from __future__ import annotations

import numpy as np

from ..core.batching import pad_batch
from ..core.tokenizer import BOS_ID, EOS_ID, FIRST_TOKEN_ID


def random_sources(vocab_size: int, batch: int, src_len: int, seed: int) -> np.ndarray:
    """<s> w... </s> rows of decreasing length (the first one full), right-padded: (B, S) int64."""
    rng = np.random.default_rng(seed)
    lengths = [max(2, src_len - i * max(1, src_len // (batch + 1))) for i in range(batch)]
    rows = [[BOS_ID, *rng.integers(FIRST_TOKEN_ID, vocab_size, n - 2).tolist(), EOS_ID] for n in lengths]
    return pad_batch(rows)


def random_targets(vocab_size: int, batch: int, length: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 1)
    tokens = rng.integers(FIRST_TOKEN_ID, vocab_size, (batch, length - 1))
    return np.concatenate([np.full((batch, 1), BOS_ID), tokens], axis=1)
