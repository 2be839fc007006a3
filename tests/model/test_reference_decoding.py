"""The ground-truth decoders: greedy = beam 1, batching with padding changes nothing, limits enforced."""

from __future__ import annotations

import pytest
import torch
from support.common import tiny_config

from tfm_export.core.batching import pad_batch
from tfm_export.core.errors import InputTextError
from tfm_export.core.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tfm_export.model.reference_decoding import beam_search, greedy_decode
from tfm_export.model.transformer import Transformer

SOURCES = [[2, 5, 6, 7, 3], [2, 8, 3], [2, 9, 10, 11, 12, 4, 3], [2, 3]]
BATCH = torch.from_numpy(pad_batch(SOURCES))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(1)
    m = Transformer(tiny_config(n_position=24)).eval()
    with torch.no_grad():  # make </s> likely enough that hypotheses finish at different lengths
        m.trg_word_prj.weight[EOS_ID] *= 3
    return m


def manual_greedy(model, src, steps):
    """Argmax over model.forward on the growing prefix, the way the seed decodes."""
    trg = [BOS_ID]
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([src]), torch.tensor([trg]))[0, -1]
        logits[PAD_ID] = -float("inf")
        trg.append(int(logits.argmax()))
        if trg[-1] == EOS_ID:
            break
    return tuple(t for t in trg[1:] if t != EOS_ID)


def test_greedy_equals_manual_argmax_loop(model):
    hyps = greedy_decode(model, BATCH, max_length=15)
    for src, hyp in zip(SOURCES, hyps, strict=True):
        assert hyp.tokens == manual_greedy(model, src, 15)
        assert PAD_ID not in hyp.tokens


def test_beam_one_is_greedy(model):
    greedy = greedy_decode(model, BATCH, max_length=15)
    beam = beam_search(model, BATCH, beam_size=1, max_length=15)
    assert [b[0].tokens for b in beam] == [g.tokens for g in greedy]
    assert [b[0].score for b in beam] == pytest.approx([g.score for g in greedy], abs=1e-5)


def test_batching_with_padding_changes_no_output(model):
    together = beam_search(model, BATCH, beam_size=4, max_length=15, n_best=4)
    alone = [beam_search(model, torch.tensor([s]), beam_size=4, max_length=15, n_best=4)[0] for s in SOURCES]
    assert [[h.tokens for h in nb] for nb in together] == [[h.tokens for h in nb] for nb in alone]


def test_beam_scores_are_sorted_and_distinct(model):
    for nbest in beam_search(model, BATCH, beam_size=4, max_length=15, length_penalty=0.6, n_best=4):
        assert [h.normalized_score for h in nbest] == sorted((h.normalized_score for h in nbest), reverse=True)
        assert len({h.tokens for h in nbest}) == len(nbest)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_score_is_the_models_log_probability_of_the_output(model, beam_size):
    src = torch.tensor([SOURCES[1]])
    hyp = beam_search(model, src, beam_size=beam_size, max_length=15)[0][0]
    with torch.no_grad():
        logp = torch.log_softmax(model(src, torch.tensor([[BOS_ID, *hyp.tokens]]))[0], -1)
    targets = [*hyp.tokens, EOS_ID] if hyp.finished else list(hyp.tokens)
    assert hyp.score == pytest.approx(sum(logp[i, t].item() for i, t in enumerate(targets)), abs=1e-4)


def test_beam_finds_at_least_greedy_score(model):
    greedy = greedy_decode(model, BATCH, max_length=15)
    beam = beam_search(model, BATCH, beam_size=5, max_length=15, length_penalty=0.0)
    for g, b in zip(greedy, beam, strict=True):
        if g.finished:
            assert b[0].score >= g.score - 1e-5


def test_max_length_cuts_hypotheses(model):
    """max_length counts </s>: a finished hypothesis has at most max_length - 1 tokens, a cut one exactly
    max_length; with a limit of 2 some are cut."""
    hyps = greedy_decode(model, BATCH, max_length=2)
    assert all(len(h.tokens) + h.finished <= 2 for h in hyps)
    assert all(len(h.tokens) == 2 for h in hyps if not h.finished) and any(not h.finished for h in hyps)


def test_source_longer_than_positions_is_rejected(model):
    with pytest.raises(InputTextError, match=r"source of 25 tokens .* longer than the model's positions \(24\)"):
        greedy_decode(model, torch.full((1, 25), 5))
    with pytest.raises(InputTextError, match="max length 30 is outside 1..24"):
        beam_search(model, torch.tensor([SOURCES[0]]), max_length=30)
