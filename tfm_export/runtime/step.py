"""One decoder step as the search loops see it: what they ask of a step (StepRule), what comes back
(Candidates), and what a backend must do (StepBackend: encode, step, and the three reorders expand / select /
permute, as CTranslate2's decoder is driven). The reduction of logits to candidates lives here too, in NumPy, for
the backends that return logits: decoder_step_search computes the same candidates inside its graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..core.machine import LARGE_BLOCK_BYTES
from ..core.token_rules import SEED_RULES, TokenRules

FULL_SORT_WIDTH = 4096  # candidates per input up to which sorting them all is cheaper than the block floor
NORMALIZER_BYTES = LARGE_BLOCK_BYTES // 2  # the log-sum-exp's temporary, at most: heap memory, reused each step


@dataclass(frozen=True)
class StepRule:
    """What the search asks of one step: `count` best candidates per row, under the model's rules (banned ids,
    </s>) with </s> barred before the minimum length and a token forced where the rules force one."""

    rules: TokenRules
    count: int
    allow_eos: bool = True
    forced: int | None = None

    @classmethod
    def at(cls, rules: TokenRules, step: int, count: int, min_length: int, max_length: int) -> StepRule:
        """forced_bos at the first step, forced_eos at the last a length limit allows (it wins there)."""
        forced = rules.forced_bos if step == 0 else None
        if step + 1 == max_length and rules.forced_eos is not None:
            forced = rules.forced_eos
        return cls(rules, count, step + 1 > min_length, forced)

    def candidates(self, logits: np.ndarray) -> Candidates:
        """The reduction decoder_step_search ends in, in NumPy, for backends that return logits: per row the
        `count` best log-probabilities after the rules, best first, ties to the lower id. May overwrite logits."""
        x = logits.astype(np.float32, copy=False)
        ids, values = _top_candidates(x, np.zeros((len(x), 1), np.float32), self.count, self.mask)
        return Candidates(values, ids, logits)

    def mask(self, x: np.ndarray) -> np.ndarray:
        """x with the tokens that may not be generated at -inf (in place): the banned ids, </s> before the
        minimum length, and everything but the forced token, whose logit becomes the row's log-sum-exp (log p =
        0 against the unmasked row, as generate()'s forcing processors leave it)."""
        if self.forced is not None:
            top, norm = _normalizers(x)
            x[:] = -np.inf
            x[:, self.forced] = (top + norm)[:, 0]
            return x
        x[:, list(self.rules.banned)] = -np.inf
        if not self.allow_eos:
            x[:, self.rules.eos] = -np.inf
        return x


@dataclass(frozen=True)
class Candidates:
    """A step's result per row: its best log-probabilities after the rules (N, >= count) and their ids, best
    first; the logits (N, V) where the backend has them on the host (views valid until its next step; where the
    backend reduced them in NumPy, with the rule's masked ids at -inf)."""

    values: np.ndarray
    ids: np.ndarray
    logits: np.ndarray | None = None


class StepBackend(Protocol):
    """What the loops need from a runtime. The state is the backend's own (cache, masks, rows per source) and
    holds all of a decode's state; steps and reorders may update it in place: the loops never reuse an old one."""

    def encode(self, src: np.ndarray) -> Any:
        """(B, S) int64 padded ids -> state for B rows, one per source."""

    def step(self, state: Any, tokens: np.ndarray, rule: StepRule) -> tuple[Any, Candidates]:
        """(N,) next input token per row -> new state and each row's candidates under `rule`."""

    def expand(self, state: Any, beams: int) -> Any:
        """Every row repeated `beams` times, consecutively (beam search's start, before any step)."""

    def select(self, state: Any, rows: np.ndarray) -> Any:
        """Row i of the result is row rows[i]: rows of inputs that finished leave, the others' rows may be
        reshuffled within their input (a row never moves to another source)."""

    def permute(self, state: Any, rows: np.ndarray) -> Any:
        """Row i of the result is row rows[i], a row of the same input (beams reshuffled, every input going on):
        the per-source part of the state is already right."""


class Reorders:
    """The one `expand` every backend shares: each row repeated is a `select` of those rows. (Backends whose rows
    are only a count before the first step see that in `select`.) The state must say how many rows it has."""

    def expand(self, state: Any, beams: int) -> Any:
        return self.select(state, np.repeat(np.arange(state.rows), beams))


class GraphBackend(StepBackend, Protocol):
    """A backend that also runs the raw graphs, so its outputs can be held to the reference tensor by tensor."""

    def run_encoder(self, src: np.ndarray) -> dict[str, np.ndarray]:
        """(B, S) padded ids -> every encoder output by name."""

    def encoded(self, src: np.ndarray, out: dict[str, np.ndarray]) -> Any:
        """encode's state from run_encoder's outputs for `src` (a backend's own, or another's of the same encoder
        graph): the checks run a long source's encoder once."""

    def run_step(self, state: Any, input_ids: np.ndarray) -> tuple[Any, np.ndarray]:
        """(N, T) new tokens -> new state and (N, T, V) logits."""


def _normalizers(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row the maximum and log-sum-exp of (x - maximum), (N, 1) each: log p = (x - max) - norm.
    Every token counts in the sum, <blank> included, as in torch's log_softmax before the mask."""
    top = x.max(axis=-1, keepdims=True)
    sums = np.empty_like(top)
    rows = max(1, NORMALIZER_BYTES // max(1, x.shape[-1] * x.itemsize))
    for start in range(0, len(x), rows):  # a few rows at a time: no second (N, V) array at the memory peak
        shifted = np.subtract(x[start:start + rows], top[start:start + rows])
        np.exp(shifted, out=shifted)
        shifted.sum(axis=-1, keepdims=True, out=sums[start:start + rows])
    return top, np.log(sums)


def _top_candidates(logits: np.ndarray, scores: np.ndarray, count: int, mask: Callable[[np.ndarray], np.ndarray]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Per input (k consecutive rows of (N, V) logits, beam scores (A, k)), the `count` best candidates
    score + log p over its k x V (beam, token) pairs: flat indices beam * V + token and their values,
    (A, count) each, best first, ties to the lower index (a stable descending sort).

    Small vocabularies sort every candidate. With large ones, sorting or partitioning k x V values per input
    would dominate beam search (~30 ms per step at 32 inputs x 4 x 32,000). Instead each row is cut into
    blocks: the count-th best block maximum is a floor that the input's count-th best candidate cannot fall
    below, so only the elements of the blocks at or above it (about `count` blocks) are scored and sorted.
    A candidate's value is monotone in its logit, so block maxima of logits give those of candidates. A block
    is every `whole`-th token (one column of a (size, whole) view, whose column maxima are one vectorised
    reduction; contiguous blocks took 9x longer), plus the short tail past size x whole; ties are put back in
    token order by the final sort."""
    x = logits.astype(np.float32, copy=False)
    (n, vocab), k = x.shape, scores.shape[1]
    top, norm = _normalizers(x)
    mask(x)
    beam_scores = scores.reshape(-1, 1)
    if k * vocab <= FULL_SORT_WIDTH:
        cand = _score(x, top, norm, beam_scores).reshape(-1, k * vocab)
        order = np.argsort(-cand, axis=1, kind="stable")[:, :count]
        return order, np.take_along_axis(cand, order, axis=1)
    size = max(1, int(np.sqrt(vocab / count)))  # tokens per block: ~vocab/size maxima + ~count * size elements
    whole = vocab // size  # strided blocks; the tail (vocab - size * whole < size tokens) is one more
    blocks = whole + (vocab > size * whole)
    maxima = x[:, :size * whole].reshape(n, size, whole).max(axis=1)
    if blocks > whole:
        maxima = np.concatenate([maxima, x[:, size * whole:].max(axis=-1, keepdims=True)], axis=1)
    block_max = _score(maxima, top, norm, beam_scores)  # (N, blocks)
    block_max = block_max.reshape(-1, k * blocks)  # (A, k * blocks), in (beam, block) order
    if block_max.shape[1] > count:
        floor = np.partition(block_max, -count, axis=1)[:, -count]
        chosen = block_max >= floor[:, None]
    else:
        chosen = np.ones(block_max.shape, dtype=bool)
    entry, block = np.nonzero(chosen)
    row, block = entry * k + block // blocks, (block % blocks)[:, None]
    column = np.where(block < whole, block + whole * np.arange(size), size * whole + np.arange(size))  # (S, size)
    values = _score(x[row[:, None], np.minimum(column, vocab - 1)], top[row], norm[row], beam_scores[row])
    values[column >= vocab] = -np.inf
    flat = (row % k)[:, None] * vocab + column
    # one padded (A, most blocks * size) table per input, then each row by value, ties by (beam, token)
    per_input = np.bincount(entry, minlength=len(block_max))
    slot = np.arange(len(entry)) - np.repeat(np.cumsum(per_input) - per_input, per_input)
    table = np.full((len(block_max), per_input.max(), size), -np.inf, dtype=np.float32)
    index = np.full(table.shape, k * vocab)  # padding sorts after every real candidate, and is returned as 0
    table[entry, slot], index[entry, slot] = values, flat
    table, index = table.reshape(len(block_max), -1), index.reshape(len(block_max), -1)
    order = np.lexsort((index, -table), axis=1)[:, :count]
    best = np.take_along_axis(index, order, axis=1)
    return np.where(best < k * vocab, best, 0), np.take_along_axis(table, order, axis=1)


def _score(x: np.ndarray, top: np.ndarray, norm: np.ndarray, beam_scores: np.ndarray) -> np.ndarray:
    """Candidate values beam score + log p for logits x of the rows whose max/norm/score are given; the
    same float32 operations for every element, so equal logits give equal candidates."""
    return beam_scores + ((x - top) - norm)




LOGITS_ONLY = StepRule(SEED_RULES, 1)  # a step whose candidates nobody reads (run_step's logits)
