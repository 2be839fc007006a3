"""ONNX Runtime against PyTorch: tensor differences step by step, and token agreement of decodes.

Every exported stage proves itself here: encoder outputs and each decoder step's logits (the cache
fed back from the previous step) against the reference model's full-sequence forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .batching import pad_batch
from .model import Transformer
from .ort_backend import OrtBackend
from .tokenizer import BOS_ID, EOS_ID


@dataclass(frozen=True)
class Tolerance:
    """A tensor passes when max |a - b| <= atol + rtol * max |b|. fp32 defaults: trained models on random
    tokens reach ~2e-5 relative (LayerNorm amplifies float reordering), random-weight models ~1e-6."""

    atol: float = 1e-4
    rtol: float = 1e-4


DEFAULT_TOLERANCE = Tolerance()


@dataclass(frozen=True)
class TensorDiff:
    name: str
    max_abs: float
    max_rel: float  # max |a - b| / max |b|
    scale: float = 1.0  # max |b|

    def within(self, tol: Tolerance) -> bool:
        return self.max_abs <= tol.atol + tol.rtol * self.scale

    @classmethod
    def of(cls, name: str, got: np.ndarray, want: np.ndarray) -> TensorDiff:
        if got.shape != want.shape:
            raise ValueError(f"{name}: shape {got.shape} != {want.shape}")
        err = float(np.abs(got.astype(np.float64) - want).max()) if got.size else 0.0
        scale = float(np.abs(want).max()) if want.size else 0.0
        return cls(name, err, err / max(scale, 1e-12), scale)


def random_sources(vocab_size: int, batch: int, src_len: int, seed: int) -> np.ndarray:
    """<s> w... </s> rows of decreasing length (the first one full), right-padded: (B, S) int64."""
    rng = np.random.default_rng(seed)
    lengths = [max(2, src_len - i * max(1, src_len // (batch + 1))) for i in range(batch)]
    rows = [[BOS_ID, *rng.integers(4, vocab_size, n - 2).tolist(), EOS_ID] for n in lengths]
    return pad_batch(rows)


def random_targets(vocab_size: int, batch: int, length: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 1)
    return np.concatenate([np.full((batch, 1), BOS_ID), rng.integers(4, vocab_size, (batch, length - 1))], axis=1)


@torch.no_grad()
def compare_stepwise(model: Transformer, backend: OrtBackend, src: np.ndarray, trg: np.ndarray,
                     steps: int | None = None) -> list[TensorDiff]:
    """Encoder outputs, then decoder_step one token at a time (cache fed back) for `steps` tokens,
    then one decoder_step call over the whole target; all against model(src, trg)."""
    full = model(torch.from_numpy(src), torch.from_numpy(trg)).numpy()  # (B, T, V)
    enc_output, _ = model.encode(torch.from_numpy(src))
    cross = model.decoder.cross_keys_values(enc_output)
    got = backend.run_encoder(src)
    diffs = [TensorDiff.of("encoder last_hidden_state", got["last_hidden_state"], enc_output.numpy())]
    want_cross = np.concatenate([t.numpy().ravel() for kv in cross for t in kv])
    got_cross = np.concatenate([got[n].ravel() for n in backend.cross_output_names])
    diffs.append(TensorDiff.of("encoder present.*.encoder.*", got_cross, want_cross))
    state = backend.encode(src)
    per_step = []
    for t in range(steps if steps is not None else trg.shape[1]):
        state, logits = backend.run_step(state, trg[:, t:t + 1])
        per_step.append(TensorDiff.of(f"step {t + 1}", logits[:, 0], full[:, t]))
    worst = max(per_step, key=lambda d: d.max_abs)
    diffs.append(TensorDiff(f"decoder_step logits, {len(per_step)} steps, cache fed back (worst: {worst.name})",
                            worst.max_abs, worst.max_rel, worst.scale))
    _, logits = backend.run_step(backend.encode(src), trg)
    diffs.append(TensorDiff.of(f"decoder_step logits, {trg.shape[1]} tokens in one call", logits, full))
    return diffs


@dataclass(frozen=True)
class Agreement:
    name: str
    identical: int
    total: int

    @property
    def rate(self) -> float:
        return self.identical / self.total if self.total else 1.0


def token_agreement(name: str, got: list[tuple[int, ...]], want: list[tuple[int, ...]]) -> Agreement:
    return Agreement(name, sum(g == w for g, w in zip(got, want, strict=True)), len(want))

