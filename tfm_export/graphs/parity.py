"""ONNX Runtime against PyTorch: tensor differences step by step, and token agreement of decodes.

Every exported stage proves itself here: encoder outputs and each decoder step's logits (the cache
fed back from the previous step) against the reference model's full-sequence forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..core.graph_spec import LAST_HIDDEN_STATE, cache_names
from ..runtime.step import GraphBackend

if TYPE_CHECKING:
    from ..model.transformer import Transformer


@dataclass(frozen=True)
class Tolerance:
    """A tensor passes when max |a - b| <= atol + rtol * max |b|. fp32 defaults: trained models on random
    tokens reach ~2e-5 relative (LayerNorm amplifies float reordering), random-weight models ~1e-6."""

    atol: float = 1e-4
    rtol: float = 1e-4


DEFAULT_TOLERANCE = Tolerance()
# Share of decodes that must be token-identical to the reference: fp32 graphs against PyTorch's reference
# decoders, fp16/int8 graphs (and TensorRT engines of that precision) against the fp32 graphs.
MIN_AGREEMENT = {"fp32": 0.99, "fp16": 0.995, "int8": 0.97}
AGREEMENT_BEAM = 4  # beam size of the beam-search agreement checks (greedy is always checked too)
SAMPLES, STEPS = 16, 30  # verify: random sources decoded by both sides; decoder steps with the cache fed back
# Export's own check also passes logits within this many times PyTorch's own float32 error on the same inputs
# (against float64): a trained pre-norm model at its full length is that far from exact in float32 itself.
FLOAT32_NOISE_FACTOR = 4
MAX_SAMPLES, MAX_STEPS = 10_000, 4096  # what --samples / --steps may ask: hours of decoding, not a hang


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
        err = _max_abs_difference(got, want) if got.size else 0.0
        scale = float(np.abs(want).max()) if want.size else 0.0
        return cls(name, err, err / max(scale, 1e-12), scale)


def _max_abs_difference(got: np.ndarray, want: np.ndarray, rows: int = 1 << 16) -> float:
    """max |got - want| in float64, a block of rows at a time: a large vocabulary's logits over the longest target
    are gigabytes in float64."""
    got, want = got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])
    step = max(1, rows * 64 // max(1, got.shape[-1]))
    return max(float(np.abs(got[i:i + step].astype(np.float64) - want[i:i + step]).max())
               for i in range(0, len(got), step))


@dataclass(frozen=True)
class Reference:
    """PyTorch's outputs for one batch, computed once for every graph held to them: the full-sequence logits, the
    encoder's output and its cross-attention keys/values (flat, in the graphs' output order)."""

    src: np.ndarray
    trg: np.ndarray
    logits: np.ndarray  # (B, T, V)
    encoder: np.ndarray  # (B, S, C)
    cross: np.ndarray
    cross_names: tuple[str, ...]  # the graphs' outputs that hold `cross`, in its order

    @classmethod
    def of(cls, model: Transformer, src: np.ndarray, trg: np.ndarray) -> Reference:
        import torch  # the reference side only; the rest of parity serves PyTorch-free checks
        with torch.no_grad():
            enc_output, src_mask = model.encode(torch.from_numpy(src))
            logits = model.decode(torch.from_numpy(trg), enc_output, src_mask).numpy()
            cross = np.concatenate([t.numpy().ravel() for kv in model.decoder.cross_keys_values(enc_output)
                                    for t in kv])
        return cls(src, trg, logits, enc_output.numpy(), cross, cache_names(model.config).cross_outputs)


def compare_stepwise(model: Transformer | Reference, backend: GraphBackend, src: np.ndarray, trg: np.ndarray,
                     steps: int | None = None, encoder: bool = True, whole: bool = True,
                     encoded: dict[str, np.ndarray] | None = None) -> list[TensorDiff]:
    """Encoder outputs, then decoder_step one token at a time (cache fed back) for `steps` tokens,
    then one decoder_step call over the whole target; all against model(src, trg) (or its Reference, computed
    once for several backends). Any backend that runs the raw graphs (GraphBackend) can be held to the reference
    this way. encoder: its outputs compared (backends of one directory share it: once is enough); whole: the
    call over the whole target made (a one-token step graph makes it one call per token); encoded: the encoder's
    outputs for `src` already computed (by another backend of the same encoder graph), else run here, once."""
    want = model if isinstance(model, Reference) else Reference.of(model, src, trg)
    encoded = backend.run_encoder(src) if encoded is None else encoded
    diffs = []
    if encoder:
        diffs.append(TensorDiff.of("encoder last_hidden_state", encoded[LAST_HIDDEN_STATE], want.encoder))
        got_cross = np.concatenate([encoded[n].ravel() for n in want.cross_names])
        diffs.append(TensorDiff.of("encoder present.*.encoder.*", got_cross, want.cross))
        del got_cross
    state = backend.encoded(src, encoded)
    per_step = []
    for t in range(steps if steps is not None else trg.shape[1]):
        state, logits = backend.run_step(state, trg[:, t:t + 1])
        per_step.append(TensorDiff.of(f"step {t + 1}", logits[:, 0], want.logits[:, t]))
    worst = max(per_step, key=lambda d: d.max_abs)
    diffs.append(TensorDiff(f"decoder_step logits, {len(per_step)} steps, cache fed back (worst: {worst.name})",
                            worst.max_abs, worst.max_rel, worst.scale))
    del state
    if whole:
        _, logits = backend.run_step(backend.encoded(src, encoded), trg)
        diffs.append(TensorDiff.of(f"decoder_step logits, {trg.shape[1]} tokens in one call", logits, want.logits))
    return diffs


def float32_noise(model: Transformer, src: np.ndarray, trg: np.ndarray) -> float:
    """max |float32 - float64| of the reference's full-sequence logits: how exact float32 itself is here."""
    import copy

    import torch
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(torch.from_numpy(src), torch.from_numpy(trg))
        return float((model(torch.from_numpy(src), torch.from_numpy(trg)).double() - exact).abs().max())


@dataclass(frozen=True)
class Agreement:
    name: str
    identical: int
    total: int
    ties: int = 0  # differing decodes that part where the reference itself is within the tolerance (near-ties)
    differing: tuple[int, ...] = ()  # indices of the decodes that are not identical

    @property
    def rate(self) -> float:
        return self.identical / self.total if self.total else 1.0

    @property
    def agreeing(self) -> float:
        """The share held to the threshold: identical decodes and near-ties, which any graph within the
        tolerance may resolve either way; only the other differences are divergences."""
        return (self.identical + self.ties) / self.total if self.total else 1.0

    @property
    def summary(self) -> str:
        ties = f", {self.ties} near-tie{'s' if self.ties > 1 else ''}" if self.ties else ""
        return f"{self.identical}/{self.total} identical{ties}"


def token_agreement(name: str, got: list[tuple[int, ...]], want: list[tuple[int, ...]],
                    ties: Callable[[int], bool] = lambda row: False) -> Agreement:
    """ties(row): whether differing decode `row` is a near-tie (the caller's judgement against the reference)."""
    differing = tuple(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
    return Agreement(name, len(want) - len(differing), len(want), sum(map(ties, differing)), differing)

