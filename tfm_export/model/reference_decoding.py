"""Ground-truth decoders: greedy and beam search over the reference model, recomputing the whole
target prefix at every step (how the seed decodes). Slow on purpose: no cache, nothing clever,
so faster decoders elsewhere can be checked against them token by token.

Conventions every decoder in this project shares:
- sources are [<s>] + tokens + [</s>], right-padded with <blank>; decoding starts from <s>;
- <blank> is never generated (the seed's target pad mask would hide it from later steps): its
  log-prob is set to -inf after log_softmax, so scores stay the model's own log-probabilities;
- `max_length` counts generated tokens, </s> included, and is at most the model's n_position;
- beam score = sum of log-probs; ranking uses score / length ** length_penalty; candidates are
  ordered by a stable descending sort, so ties go to the lower (beam, token) index;
- a batch entry stops when its best candidate of a step is </s> (then no live hypothesis has a
  higher score) or at max_length; every </s> among the beam_size best candidates is kept as a
  finished hypothesis on the way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.errors import InputTextError
from ..core.hypothesis import Hypothesis
from ..core.sources import check_source_length
from ..core.tokenizer import BOS_ID, EOS_ID, PAD_ID
from .transformer import Transformer, get_pad_mask, get_subsequent_mask


def check_lengths(model: Transformer, src: Tensor, max_length: int | None) -> int:
    n_position = model.config.n_position
    check_source_length(src.size(1), n_position)
    if max_length is None:
        return n_position
    if not 1 <= max_length <= n_position:
        raise InputTextError(f"max length {max_length} is outside 1..{n_position} (the model's positions)")
    return max_length


def next_logprobs(model: Transformer, trg: Tensor, enc_output: Tensor, src_mask: Tensor) -> Tensor:
    """Full-recompute step: (N, t) target prefix -> (N, V) float32 log-probs of the next token."""
    trg_mask = get_pad_mask(trg, model.trg_pad_idx) & get_subsequent_mask(trg)
    logits = model.project(model.decoder(trg, trg_mask, enc_output, src_mask))[:, -1]
    logp = F.log_softmax(logits.float(), dim=-1)
    logp[:, PAD_ID] = -float("inf")
    return logp


@torch.no_grad()
def greedy_decode(model: Transformer, src: Tensor, max_length: int | None = None) -> list[Hypothesis]:
    """src: (B, S) padded ids -> one hypothesis per row."""
    max_length = check_lengths(model, src, max_length)
    enc_output, src_mask = model.encode(src)
    trg = torch.full((src.size(0), 1), BOS_ID, dtype=torch.long)
    scores = torch.zeros(src.size(0))
    done = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_length):
        logp = next_logprobs(model, trg, enc_output, src_mask)
        best = logp.argmax(-1)  # first index among equal maxima
        scores += torch.where(done, 0.0, logp.gather(1, best[:, None])[:, 0])
        trg = torch.cat([trg, torch.where(done, PAD_ID, best)[:, None]], dim=1)
        done |= best == EOS_ID
        if done.all():
            break
    rows = zip(trg[:, 1:].tolist(), scores.tolist(), strict=True)
    return [_greedy_hypothesis(row, score) for row, score in rows]


def _greedy_hypothesis(row: list[int], score: float) -> Hypothesis:
    if EOS_ID in row:
        return Hypothesis(tuple(row[:row.index(EOS_ID)]), score)
    return Hypothesis(tuple(row), score, finished=False)


@torch.no_grad()
def beam_search(model: Transformer, src: Tensor, beam_size: int = 4, max_length: int | None = None,
                length_penalty: float = 1.0, n_best: int = 1) -> list[list[Hypothesis]]:
    """src: (B, S) padded ids -> the n_best hypotheses per row, best first."""
    max_length = check_lengths(model, src, max_length)
    if not 1 <= n_best <= beam_size:
        raise InputTextError(f"n_best {n_best} must be between 1 and the beam size {beam_size}")
    batch, k = src.size(0), beam_size
    enc_output, src_mask = model.encode(src)
    enc_output, src_mask = enc_output.repeat_interleave(k, 0), src_mask.repeat_interleave(k, 0)  # (B*K, ...)
    trg = torch.full((batch * k, 1), BOS_ID, dtype=torch.long)
    scores = torch.full((batch, k), -float("inf"))
    scores[:, 0] = 0.0  # one live beam at the start, so the first step does not pick duplicates
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    done = [False] * batch
    for step in range(max_length):
        logp = next_logprobs(model, trg, enc_output, src_mask)  # (B*K, V)
        cand = (scores.view(-1, 1) + logp).view(batch, -1)  # (B, K*V)
        order = torch.sort(cand, dim=1, descending=True, stable=True).indices[:, :2 * k]
        last = step + 1 == max_length
        picked = []
        for b in range(batch):
            picked += _advance(b, order[b].tolist(), cand[b], logp.size(1), k, trg, finished[b], done,
                               length_penalty, last)
        rows, tokens, new_scores = (list(column) for column in zip(*picked, strict=True))
        trg = torch.cat([trg[rows], torch.tensor(tokens)[:, None]], dim=1)
        scores = torch.tensor(new_scores).view(batch, k)
        if all(done):
            break
    return [sorted(f, key=lambda h: -h.normalized_score)[:n_best] for f in finished]


def _advance(b: int, order: list[int], cand: Tensor, vocab: int, k: int, trg: Tensor, finished: list[Hypothesis],
             done: list[bool], length_penalty: float, last: bool) -> list[tuple[int, int, float]]:
    """One batch entry's step: file finished hypotheses, return k (row, token, score) to continue."""
    picked: list[tuple[int, int, float]] = []
    for rank, index in enumerate(order if not done[b] else []):
        beam, token = divmod(index, vocab)
        row, score = b * k + beam, float(cand[index])
        if score == -float("inf") or len(picked) == k:
            break
        if token != EOS_ID:
            picked.append((row, token, score))
        elif rank < k:  # </s> counts only among the k best candidates
            finished.append(Hypothesis(tuple(trg[row, 1:].tolist()), score, length_penalty))
            done[b] = done[b] or rank == 0  # the best candidate ends: no live beam scores higher
    if last and not done[b]:
        finished += [Hypothesis((*trg[row, 1:].tolist(), token), score, length_penalty, finished=False)
                     for row, token, score in picked]
        done[b] = True
    if done[b]:
        picked = []
    filler = (b * k, PAD_ID, -float("inf"))  # entry done: keep the batch shape, never chosen again
    return picked + [filler] * (k - len(picked))
