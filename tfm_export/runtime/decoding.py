"""The one decoding loop (greedy and beam search) over any backend that can encode, step and reorder.

NumPy only, so ONNX Runtime and TensorRT backends need no PyTorch. Conventions are those of
reference_decoding (which recomputes everything and is the ground truth these are tested against):
<blank> never generated, scores are summed log-probs, ties go to the lower (beam, token) index,
an input stops when its best candidate is </s>. Finished inputs drop out of the batch.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..core.hypothesis import Hypothesis
from ..core.tokenizer import BOS_ID, EOS_ID, PAD_ID


class StepBackend(Protocol):
    """What the loop needs from a runtime. `state` is the backend's own (cache, masks)."""

    def encode(self, src: np.ndarray) -> Any:
        """(B, S) int64 padded ids -> state for B rows."""

    def step(self, state: Any, tokens: np.ndarray) -> tuple[Any, np.ndarray]:
        """(N,) next input token per row -> (new state, (N, V) float32 logits)."""

    def reorder(self, state: Any, rows: np.ndarray, same_sources: bool = False) -> Any:
        """Keep/duplicate/permute rows of the state: row i of the result is row rows[i].
        same_sources: rows[i] and i hold the same source (beams reshuffled within each input), so the
        per-source part of the state (encoder output, cross K/V, mask) is already right and is not copied."""


class GraphBackend(StepBackend, Protocol):
    """A backend that also runs the raw graphs, so its outputs can be held to the reference tensor by tensor."""

    def run_encoder(self, src: np.ndarray) -> dict[str, np.ndarray]:
        """(B, S) padded ids -> every encoder output by name."""

    def run_step(self, state: Any, input_ids: np.ndarray) -> tuple[Any, np.ndarray]:
        """(N, T) new tokens -> new state and (N, T, V) logits."""


def log_softmax(logits: np.ndarray, allow_eos: bool = True) -> np.ndarray:
    x = logits.astype(np.float32, copy=False)
    shifted = x - x.max(axis=-1, keepdims=True)
    out = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    out[:, PAD_ID] = -np.inf
    if not allow_eos:
        out[:, EOS_ID] = -np.inf
    return out


def greedy(backend: StepBackend, src: np.ndarray, max_length: int, min_length: int = 0) -> list[Hypothesis]:
    """min_length: </s> is barred before that many tokens (benchmarks force equal work with min = max)."""
    state = backend.encode(src)
    active = np.arange(len(src))  # input index of each live row
    tokens = np.full(len(src), BOS_ID, dtype=np.int64)
    outputs: list[list[int]] = [[] for _ in range(len(src))]
    scores = np.zeros(len(src), dtype=np.float32)
    ended = np.zeros(len(src), dtype=bool)
    for step in range(max_length):
        state, logits = backend.step(state, tokens)
        logp = log_softmax(logits, allow_eos=step + 1 > min_length)
        best = logp.argmax(axis=-1)  # first index among equal maxima, as torch.argmax
        scores[active] += logp[np.arange(len(best)), best]
        for row, token in zip(active, best, strict=True):
            if token == EOS_ID:
                ended[row] = True
            else:
                outputs[row].append(int(token))
        live = best != EOS_ID
        if not live.any():
            break
        if not live.all():
            state = backend.reorder(state, np.flatnonzero(live))
        active, tokens = active[live], best[live].astype(np.int64)
    return [Hypothesis(tuple(o), float(s), finished=bool(e)) for o, s, e in zip(outputs, scores, ended, strict=True)]


def _top_candidates(cand: np.ndarray, count: int) -> np.ndarray:
    """Per row, the `count` best indices, best first, ties by lower index (a stable descending sort).
    Sorting k x vocab candidates per step would dominate beam search, and argpartition both costs
    ~45 ms per step at 32 x 4 x 32,000 and picks arbitrarily among ties at the cut. Instead: the
    count-th best of a strided sample is a floor the row's count-th best cannot fall below, so only
    the few values at or above it are sorted exactly."""
    count = min(count, cand.shape[1])
    stride = max(1, cand.shape[1] // (64 * count))
    floors = np.partition(cand[:, ::stride], -count, axis=1)[:, -count] if cand[:, ::stride].shape[1] >= count \
        else np.full(len(cand), -np.inf, dtype=cand.dtype)
    out = np.empty((len(cand), count), dtype=np.int64)
    for row, floor in enumerate(floors):
        index = np.flatnonzero(cand[row] >= floor) if floor > -np.inf else np.arange(cand.shape[1])
        out[row] = index[np.lexsort((index, -cand[row, index]))[:count]]
    return out


def beam_search(backend: StepBackend, src: np.ndarray, beam_size: int, max_length: int,
                length_penalty: float = 1.0, n_best: int = 1, min_length: int = 0) -> list[list[Hypothesis]]:
    k, batch = beam_size, len(src)
    state = backend.reorder(backend.encode(src), np.repeat(np.arange(batch), k))
    active = list(range(batch))  # inputs still searching; their rows are k consecutive state rows
    prefixes: list[tuple[int, ...]] = [()] * (batch * k)  # per state row
    scores = np.full((batch, k), -np.inf, dtype=np.float32)
    scores[:, 0] = 0.0  # one live beam at first, so the first step picks no duplicates
    tokens = np.full(batch * k, BOS_ID, dtype=np.int64)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    for step in range(max_length):
        state, logits = backend.step(state, tokens)
        logp = log_softmax(logits, allow_eos=step + 1 > min_length)  # (A*k, V)
        vocab = logp.shape[1]
        cand = (scores.reshape(-1, 1) + logp).reshape(len(active), k * vocab)
        top = _top_candidates(cand, 2 * k)
        rows, next_tokens, next_scores, still = [], [], [], []
        for a, entry in enumerate(active):
            picked = _advance(a, top[a], cand[a], vocab, k, prefixes, finished[entry], length_penalty,
                              last=step + 1 == max_length)
            if picked:
                still.append(entry)
                rows += [r for r, _, _ in picked]
                next_tokens += [t for _, t, _ in picked]
                next_scores += [s for _, _, s in picked]
        if not still:
            break
        state = backend.reorder(state, np.array(rows), same_sources=len(still) == len(active))
        prefixes = [(*prefixes[r], t) for r, t in zip(rows, next_tokens, strict=True)]
        tokens = np.array(next_tokens, dtype=np.int64)
        scores = np.array(next_scores, dtype=np.float32).reshape(len(still), k)
        active = still
    return [sorted(f, key=lambda h: -h.normalized_score)[:n_best] for f in finished]


def _advance(a: int, top: np.ndarray, cand: np.ndarray, vocab: int, k: int, prefixes: list[tuple[int, ...]],
             finished: list[Hypothesis], length_penalty: float, last: bool) -> list[tuple[int, int, float]]:
    """One input's step. Returns k (state row, token, score) to continue with, or [] when it is done."""
    picked: list[tuple[int, int, float]] = []
    done = False
    for rank, index in enumerate(top.tolist()):
        beam, token = divmod(index, vocab)
        row, score = a * k + beam, float(cand[index])
        if score == -np.inf or len(picked) == k:
            break
        if token != EOS_ID:
            picked.append((row, token, score))
        elif rank < k:  # </s> counts only among the k best candidates
            finished.append(Hypothesis(prefixes[row], score, length_penalty))
            done = done or rank == 0  # the best candidate ends: no live beam scores higher
    if last and not done:
        finished += [Hypothesis((*prefixes[r], t), s, length_penalty, finished=False) for r, t, s in picked]
        done = True
    if done or not picked:
        return []
    filler = (picked[0][0], PAD_ID, -np.inf)  # keeps k rows; a -inf score is never chosen
    return picked + [filler] * (k - len(picked))
