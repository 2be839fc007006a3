"""Generated model inputs for checks and smoke tests: padded source batches and target prefixes of
ordinary tokens, NumPy only (quantize and check use them without PyTorch)."""

from __future__ import annotations

import numpy as np

from ..core.batching import pad_batch
from ..core.tokenizer import BOS_ID, EOS_ID, FIRST_TOKEN_ID, PAD_ID


def random_sources(vocab_size: int, batch: int, src_len: int, seed: int, pad: int = PAD_ID) -> np.ndarray:
    """<s> w... </s> rows of decreasing length (the first one full), right-padded with `pad`: (B, S) int64."""
    rng = np.random.default_rng(seed)
    lengths = [max(2, src_len - i * max(1, src_len // (batch + 1))) for i in range(batch)]
    rows = [[BOS_ID, *_without(rng.integers(FIRST_TOKEN_ID, vocab_size, n - 2), pad).tolist(), EOS_ID]
            for n in lengths]
    return pad_batch(rows, pad)


def random_targets(vocab_size: int, batch: int, length: int, seed: int, pad: int = PAD_ID) -> np.ndarray:
    """Target prefixes without `pad` after the start (a decoder never reads padding there)."""
    rng = np.random.default_rng(seed + 1)
    tokens = _without(rng.integers(FIRST_TOKEN_ID, vocab_size, (batch, length - 1)), pad)
    return np.concatenate([np.full((batch, 1), BOS_ID), tokens], axis=1)


def _without(tokens: np.ndarray, pad: int) -> np.ndarray:
    """Ordinary tokens: a pretrained model's padding id may fall among them (the seed's never does)."""
    return np.where(tokens == pad, FIRST_TOKEN_ID if pad != FIRST_TOKEN_ID else FIRST_TOKEN_ID + 1, tokens)
