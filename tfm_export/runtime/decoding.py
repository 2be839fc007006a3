"""The search loops (greedy and beam search) over any StepBackend (runtime.step): the reference's rules, and
generate()'s for pretrained models.

NumPy only, so ONNX Runtime and TensorRT backends need no PyTorch. Conventions are those of
reference_decoding (which recomputes everything and is the ground truth these are tested against):
<blank> never generated, scores are summed log-probs, ties go to the lower (beam, token) index,
an input stops when its best candidate is </s>. Finished inputs drop out of the batch.

A step hands the loop each row's few best (log-probability, id) pairs under the decoding rules, not its
logits (StepRule.candidates). The bookkeeping is whole-array work over all rows and inputs at once (no Python loop
per row or per input): on a small model the Python around each step decides the speed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..core.hypothesis import Hypothesis
from ..core.token_rules import SEED_RULES, TokenRules
from .step import Candidates, StepBackend, StepRule


def greedy(backend: StepBackend, src: np.ndarray, max_length: int, min_length: int = 0,
           rules: TokenRules = SEED_RULES) -> list[Hypothesis]:
    """min_length: </s> is barred before that many tokens (benchmarks force equal work with min = max).
    A row still live at step t has generated exactly t tokens, so its token goes to column t; a row that
    ends at step t has t tokens."""
    state = backend.encode(src)
    batch = len(src)
    active = np.arange(batch)  # input index of each live row
    tokens = np.full(batch, rules.start, dtype=np.int64)
    generated = np.zeros((batch, max_length), dtype=np.int64)
    lengths = np.full(batch, max_length, dtype=np.int64)  # until a row ends
    scores = np.zeros(batch, dtype=np.float32)
    for step in range(max_length):
        state, found = backend.step(state, tokens, StepRule.at(rules, step, 1, min_length, max_length))
        tokens = found.ids[:, 0].astype(np.int64)  # the first of equal maxima, as torch.argmax
        scores[active] += found.values[:, 0]
        generated[active, step] = tokens
        live = tokens != rules.eos
        if live.all():
            continue
        lengths[active[~live]] = step
        if not live.any():
            break
        state = backend.select(state, np.flatnonzero(live))
        active, tokens = active[live], tokens[live]
    ended = lengths < max_length  # the others ran every step
    return [Hypothesis(tuple(row[:n].tolist()), float(s), finished=bool(e))
            for row, n, s, e in zip(generated, lengths, scores, ended, strict=True)]


def _merge(found: Candidates, scores: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per input (k consecutive rows, beam scores (A, k)), its `count` best candidates score + log p among its
    rows' own best: beams, tokens and values, (A, count) each, best first, ties to the lower (beam, token). A
    candidate among an input's count best is among its row's count best, so the rows' lists suffice."""
    (inputs, k), each = scores.shape, min(count, found.values.shape[1])  # a vocabulary may have fewer
    values = (scores.reshape(-1, 1) + found.values[:, :each]).reshape(inputs, k * each)
    tokens = found.ids[:, :each].reshape(inputs, k * each).astype(np.int64)
    beams = np.broadcast_to(np.repeat(np.arange(k), each), values.shape)
    order = np.lexsort((tokens, beams, -values), axis=1)[:, :count]
    return (np.take_along_axis(beams, order, axis=1), np.take_along_axis(tokens, order, axis=1),
            np.take_along_axis(values, order, axis=1))


class _Choice(NamedTuple):
    """One step's decisions for all A searching inputs at once, from their 2k best candidates (ranked)."""

    beam: np.ndarray  # (A, 2k) the candidate's beam
    token: np.ndarray  # (A, 2k)
    value: np.ndarray  # (A, 2k) its score
    ends: np.ndarray | None  # (A, 2k) a </s> among the k best: a finished hypothesis (None: there is none)
    picked: np.ndarray  # (A, k) ranks of the continuations, best first (the first `found` are real)
    found: np.ndarray  # (A,) continuations found (k unless -inf candidates ran out)
    going: np.ndarray  # (A,) still searching after this step


def _choose(beam: np.ndarray, token: np.ndarray, value: np.ndarray, k: int, last: bool, eos: int) -> _Choice:
    """The reference's per-input rule as array operations: candidates are taken best first until k
    non-</s> ones are picked or -inf is reached; a </s> among the k best becomes a finished hypothesis, and
    if it is the very best the input is done (no live beam can score higher); the last step ends all.
    Most steps have no </s> and no -inf among the k best: then the k best simply go on."""
    if not last and value[:, k - 1].min() > -np.inf and not (token[:, :k] == eos).any():
        everyone = np.ones(len(beam), dtype=bool)
        return _Choice(beam, token, value, None, np.broadcast_to(np.arange(k), (len(beam), k)),
                       np.full(len(beam), k), everyone)
    valid = value > -np.inf  # ranked best first, so -inf ones come last
    ends = valid & (token == eos) & (np.arange(beam.shape[1]) < k)
    word = valid & (token != eos)
    word &= np.cumsum(word, axis=1) <= k
    found = word.sum(axis=1)
    picked = np.argsort(~word, axis=1, kind="stable")[:, :k]
    going = ~ends[:, 0] & (found > 0) & (not last)
    return _Choice(beam, token, value, ends, picked, found, going)


def _continue(choice: _Choice, k: int, pad: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """State rows, tokens and scores (A', k) of the inputs that go on; an input with fewer than k
    continuations fills up with copies of its first one at score -inf (never chosen again)."""
    inputs = np.arange(len(choice.picked))[:, None]
    rows = inputs * k + choice.beam[inputs, choice.picked]
    tokens, scores = choice.token[inputs, choice.picked], choice.value[inputs, choice.picked]
    if choice.ends is not None:
        filler = np.arange(k) >= choice.found[:, None]
        rows = np.where(filler, rows[:, :1], rows)[choice.going]
        tokens = np.where(filler, pad, tokens)[choice.going]
        scores = np.where(filler, -np.inf, scores)[choice.going]
    return rows.ravel(), tokens.ravel(), scores.astype(np.float32, copy=False)


def _file(finished: list[list[Hypothesis]], active: np.ndarray, history: np.ndarray, choice: _Choice, k: int,
          length_penalty: float, last: bool) -> None:
    """Finished hypotheses in the reference's order (rank order within a step); at the last step the
    continuations of inputs not yet done are kept too, unfinished. Only real events loop in Python."""
    if choice.ends is None:
        return
    for a, rank in zip(*np.nonzero(choice.ends), strict=True):
        prefix = history[a * k + choice.beam[a, rank]]
        finished[active[a]].append(Hypothesis(tuple(prefix.tolist()), float(choice.value[a, rank]), length_penalty))
    if not last:
        return
    for a in np.flatnonzero(~choice.ends[:, 0]):
        for rank in choice.picked[a, :choice.found[a]]:
            prefix = history[a * k + choice.beam[a, rank]]
            finished[active[a]].append(Hypothesis((*prefix.tolist(), int(choice.token[a, rank])),
                                                  float(choice.value[a, rank]), length_penalty, finished=False))


def beam_search(backend: StepBackend, src: np.ndarray, beam_size: int, max_length: int,
                length_penalty: float = 1.0, n_best: int = 1, min_length: int = 0,
                rules: TokenRules = SEED_RULES) -> list[list[Hypothesis]]:
    k, batch = beam_size, len(src)
    state = backend.expand(backend.encode(src), k)
    active = np.arange(batch)  # inputs still searching; their rows are k consecutive state rows
    history = np.zeros((batch * k, 0), dtype=np.int64)  # tokens so far, per state row
    scores = np.full((batch, k), -np.inf, dtype=np.float32)
    scores[:, 0] = 0.0  # one live beam at first, so the first step picks no duplicates
    tokens = np.full(batch * k, rules.start, dtype=np.int64)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    for step in range(max_length):
        state, found = backend.step(state, tokens, StepRule.at(rules, step, 2 * k, min_length, max_length))
        last = step + 1 == max_length
        choice = _choose(*_merge(found, scores, 2 * k), k, last, rules.eos)
        _file(finished, active, history, choice, k, length_penalty, last)
        if not choice.going.any():
            break
        rows, tokens, scores = _continue(choice, k, rules.pad)
        everyone = choice.ends is None or bool(choice.going.all())
        state = backend.permute(state, rows) if everyone else backend.select(state, rows)
        history = np.concatenate([history[rows], tokens[:, None]], axis=1)
        active = active if everyone else active[choice.going]
    return [sorted(f, key=lambda h: -h.normalized_score)[:n_best] for f in finished]


def transformers_beam_search(backend: StepBackend, src: np.ndarray, beam_size: int, max_length: int,
                             length_penalty: float = 1.0, n_best: int = 1, min_length: int = 0,
                             rules: TokenRules = SEED_RULES) -> list[list[Hypothesis]]:
    """Beam search as transformers' generate() runs it, for pretrained models whose outputs must match it: of
    the 2k best candidates, a </s> among the k best is kept as finished with its score / generated length **
    penalty (the k best finished are kept); the k best others go on. When an input is done follows the rules'
    early_stopping (_may_improve); at max_length the k best candidates end as they are. min_length: </s> is
    barred before that many tokens (benchmarks)."""
    k, batch = beam_size, len(src)
    state = backend.expand(backend.encode(src), k)
    running = np.full((batch, k), -1e9, dtype=np.float32)
    running[:, 0] = 0.0  # one live beam at first, as generate() starts
    history = np.zeros((batch * k, 0), dtype=np.int64)
    tokens = np.full(batch * k, rules.start, dtype=np.int64)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    searching = np.ones(batch, dtype=bool)
    for step in range(max_length):
        state, found = backend.step(state, tokens, StepRule.at(rules, step, 2 * k, min_length, max_length))
        last = step + 1 == max_length
        beam, token, value = _merge(found, running, 2 * k)
        ends = (token == rules.eos) | last
        _file_transformers(finished, searching, history, beam, token, value, ends, k, length_penalty, rules.eos)
        going = np.argsort(-(value - 1e9 * ends), axis=1, kind="stable")[:, :k]
        running = np.take_along_axis(value - 1e9 * ends, going, axis=1).astype(np.float32)
        searching &= _may_improve(finished, running[:, 0], k, step + 1, max_length, length_penalty,
                                  rules.early_stopping)
        if last or not searching.any():
            break
        rows = (np.arange(batch)[:, None] * k + np.take_along_axis(beam, going, axis=1)).ravel()
        tokens = np.take_along_axis(token, going, axis=1).ravel()
        state = backend.permute(state, rows)
        history = np.concatenate([history[rows], tokens[:, None]], axis=1)
    return [f[:n_best] for f in finished]


def beam_search_for(rules: TokenRules) -> Callable[..., list[list[Hypothesis]]]:
    """The beam search a model's rules name: generate()'s for a pretrained model, the reference's otherwise."""
    return transformers_beam_search if rules.beam_rule == "transformers" else beam_search


def _may_improve(finished: list[list[Hypothesis]], best: np.ndarray, k: int, length: int, max_length: int,
                 length_penalty: float, early_stopping: bool | str) -> list[bool]:
    """Which inputs search on: those with fewer than k finished, and, unless early_stopping is True, those
    whose best live score could still beat the worst finished one, estimated at the current length
    (early_stopping False) or, with a positive penalty, at max_length ("never")."""
    if early_stopping == "never" and length_penalty > 0:
        length = max_length
    return [len(f) < k or (early_stopping is not True and best[i] / length ** length_penalty > f[-1].normalized_score)
            for i, f in enumerate(finished)]


def _file_transformers(finished: list[list[Hypothesis]], searching: np.ndarray, history: np.ndarray,
                       beam: np.ndarray, token: np.ndarray, value: np.ndarray, ends: np.ndarray, k: int,
                       length_penalty: float, eos: int) -> None:
    """The ending candidates among each searching input's k best join its finished list, which keeps the k
    best by normalized score (earlier ones first among equals)."""
    for i, rank in zip(*np.nonzero(ends[:, :k] & searching[:, None]), strict=True):
        prefix = tuple(history[i * k + beam[i, rank]].tolist())
        done = token[i, rank] == eos
        hyp = Hypothesis(prefix if done else (*prefix, int(token[i, rank])), float(value[i, rank]),
                         length_penalty, finished=bool(done))
        finished[i] = sorted([*finished[i], hyp], key=lambda h: -h.normalized_score)[:k]
