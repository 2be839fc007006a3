"""Every fast decoder against the full-recompute reference decoders (the PyTorch backend among them:
runtime/backends/reference.py is held to them here), on a random model whose beams reshuffle every step: tokens,
scores, finished flags and whole n-best lists, at several length penalties, with ties.

The demo model is too peaked for this (its beams rarely reorder, so a broken reorder or ranking survives
there); these models are random and flat, and each test first checks that what it tests actually happens.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from support.backends import (
    SHORT_LENGTH,
    CountingReorders,
    assert_same_nbest,
    concat_backend,
    step_backend,
)
from support.common import short_sources, tiny_config

from tfm_export.core.graph_spec import SEARCH_BEAMS
from tfm_export.core.hypothesis import Hypothesis
from tfm_export.core.tokenizer import EOS_ID
from tfm_export.model import reference_decoding
from tfm_export.runtime import decoding, step
from tfm_export.runtime.backends import DEVICE, INPLACE
from tfm_export.runtime.backends.reference import TorchBackend

# search: decoder_step_search's own candidates; -growing: its cache buffers fill up and grow every 3 steps;
# -logits: its logits reduced in NumPy, as for beams wider than the graph's K; fused: decoder_step_search_fused;
# device: decoder_step_search with all its memory in OrtValues (the GPU path, on the CPU)
BACKENDS = ("torch", "onnxruntime", "search", "search-growing", "search-logits", "fused",
            "fused-growing", "device", "device-growing", "tensorrt-cache-handling")


class LogitsOnly(CountingReorders):
    """Every step asks for more candidates than the graph's K, so they come from its logits, reduced in NumPy
    (the path of beams wider than the graph serves); the loop reads the first ones it needs."""

    def step(self, state, tokens, rule):
        wide = dataclasses.replace(rule, count=self.backend.top_k + 1)
        return self.backend.step(state, tokens, wide)


def open_backend(name: str, ckpt, directory):
    """The backend a BACKENDS name stands for; the ONNX Runtime ones opened through the runtime's door."""
    if name == "torch":
        return TorchBackend(ckpt.model)
    if name == "onnxruntime":
        return concat_backend(directory)
    growth = {"cache_step": 3} if name.endswith("-growing") else {}
    if name.startswith("device"):
        return step_backend(directory, DEVICE, **growth)
    if name.startswith(("search", "fused")):
        backend = step_backend(directory, INPLACE, fused=name.startswith("fused"), **growth)
        return LogitsOnly(backend) if name.endswith("-logits") else backend
    from support.tensorrt import cache_handling_backend
    return cache_handling_backend(directory)[0]


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("length_penalty", [0.0, 0.6, 1.0, 2.0])
def test_beam_search_equals_the_reference_where_beams_reshuffle(flat, backend_name, length_penalty):
    ckpt, directory = flat
    backend = CountingReorders(open_backend(backend_name, ckpt, directory))
    finished = []
    for k, count, seed in ((4, 7, 0), (3, 1, 1), (2, 5, 2), (SEARCH_BEAMS, 3, 3), (SEARCH_BEAMS + 1, 2, 4)):
        src = short_sources(ckpt.config.src_vocab_size, count, seed)
        got = decoding.beam_search(backend, src, k, SHORT_LENGTH, length_penalty, n_best=k)
        want = reference_decoding.beam_search(ckpt.model, torch.from_numpy(src), k, SHORT_LENGTH, length_penalty,
                                              n_best=k)
        assert_same_nbest(got, want)
        finished += [h.finished for nb in want for h in nb]
    assert any(finished) and not all(finished), "the test needs hypotheses that end and ones that are cut"
    assert backend.moved > 20, "beams must reshuffle within inputs, or the cache reorder goes untested"


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_greedy_equals_the_reference_as_rows_finish(flat, backend_name):
    ckpt, directory = flat
    backend = open_backend(backend_name, ckpt, directory)
    src = short_sources(ckpt.config.src_vocab_size, 32, 7)
    got = decoding.greedy(backend, src, SHORT_LENGTH)
    want = reference_decoding.greedy_decode(ckpt.model, torch.from_numpy(src), SHORT_LENGTH)
    assert_same_nbest([[h] for h in got], [[h] for h in want])
    lengths = {len(h.tokens) for h in want if h.finished}
    assert len(lengths) >= 2 and not all(h.finished for h in want), "rows must leave the batch at different steps"


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_exact_ties_go_to_the_lower_beam_and_token_everywhere(tied, backend_name):
    ckpt, directory = tied
    backend = open_backend(backend_name, ckpt, directory)
    src = np.array([[2, 5, 6, 3], [2, 7, 3, 1]])
    for k in (3, 5, SEARCH_BEAMS):
        got = decoding.beam_search(backend, src, k, 6, 0.6, n_best=k)
        want = reference_decoding.beam_search(ckpt.model, torch.from_numpy(src), k, 6, 0.6, n_best=k)
        assert_same_nbest(got, want)
    assert [h.tokens for h in decoding.greedy(backend, src, 6)] == \
        [h.tokens for h in reference_decoding.greedy_decode(ckpt.model, torch.from_numpy(src), 6)]


@pytest.mark.parametrize("backend_name", ["torch", "search"])
def test_the_last_step_keeps_every_unfinished_input_and_no_finished_one(flat, backend_name):
    """At max lengths of 2 to 6 the search is cut while some inputs' best beams have ended and others' have
    not: the last step files the continuations of exactly the inputs still searching (n-best = beam, so each
    input's whole list is compared, its finished flags included)."""
    ckpt, directory = flat
    backend = open_backend(backend_name, ckpt, directory)
    src = short_sources(ckpt.config.src_vocab_size, 7, 5)
    ended_early = cut = 0
    for max_length in range(2, 7):
        for k, penalty in ((4, 1.0), (3, 0.6), (2, 2.0)):
            got = decoding.beam_search(backend, src, k, max_length, penalty, n_best=k)
            want = reference_decoding.beam_search(ckpt.model, torch.from_numpy(src), k, max_length, penalty,
                                                  n_best=k)
            assert_same_nbest(got, want)
            ended_early += sum(nb[0].finished for nb in want)
            cut += sum(not h.finished for nb in want for h in nb)
    assert ended_early and cut, "the test needs inputs whose best beam ended before the cut and inputs cut"


@pytest.mark.parametrize("penalty", [-1.0, 0.0, 0.6, 2.0])
def test_inputs_search_on_exactly_when_generates_own_rule_says(penalty):
    """Pretrained models' beam search stops an input as generate() does: transformers' own stopping heuristic
    (GenerationMixin._check_early_stop_heuristic) is the oracle, on inputs with fewer than k and with k finished
    hypotheses, whose best live score lies on either side of the worst finished one, at every length; "never"
    judges a positive penalty at max_length, False at the current length."""
    from transformers.generation.utils import GenerationMixin
    rng = np.random.default_rng(int(penalty * 10) + 11)
    k, max_length, inputs = 3, 8, 64
    going, parted = [], False
    for length in range(1, max_length + 1):
        finished = [sorted((Hypothesis(tuple(range(rng.integers(0, length))), -rng.uniform(0.1, 4), penalty)
                            for _ in range(k - (i % 4 == 0))), key=lambda h: -h.normalized_score)
                    for i in range(inputs)]
        best = -rng.uniform(0.1, 4, inputs).astype(np.float32)
        finished[1] = [Hypothesis((), float(best[1]), penalty)] * k  # a live beam exactly as good: it may stop
        worst = torch.tensor([[min(h.normalized_score for h in f)] if f else [0.0] for f in finished])
        whole = torch.tensor([[len(f) == k] for f in finished])
        outcomes = {}
        for rule in (False, "never"):
            want = GenerationMixin._check_early_stop_heuristic(
                torch.ones(inputs, 1, dtype=torch.bool), torch.from_numpy(best)[:, None], worst, whole,
                cur_len=length + 1, max_length=max_length + 1, decoder_prompt_len=1, early_stopping=rule,
                length_penalty=penalty)
            got = decoding._may_improve(finished, best, k, length, max_length, penalty, rule)
            assert got == want[:, 0].tolist()
            outcomes[rule] = got
        going += outcomes[False]
        parted |= outcomes["never"] != outcomes[False]
    assert 0 < sum(going) < len(going), "inputs must stop and go on"
    assert parted == (penalty > 0), "the two rules part exactly where the penalty is positive"


@pytest.mark.parametrize("tokens, finished, score, penalty", [
    ((5, 6, 7), True, -3.0, 1.0), ((5, 6, 7), False, -3.0, 1.0), ((), True, -0.5, 0.6), ((9,), True, -2.0, 0.0),
    ((4, 5), True, -1.5, 2.0), ((), False, -0.1, 1.0)])
def test_normalized_score_is_score_over_length_to_the_penalty(tokens, finished, score, penalty):
    """Length counts the generated tokens and the final </s> when there is one; an empty unfinished hypothesis
    is divided by 1, not 0."""
    length = len(tokens) + (1 if finished else 0)
    want = score / max(length, 1) ** penalty
    assert Hypothesis(tokens, score, penalty, finished).normalized_score == pytest.approx(want)


def test_a_hypothesis_that_ends_early_can_win_only_through_the_length_penalty(flat):
    """With penalty 0 the best summed log-probability wins; with 2 longer finished hypotheses gain: both
    orders must match the reference's on the same search."""
    ckpt, directory = flat
    src = short_sources(ckpt.config.src_vocab_size, 6, 3)
    backend = concat_backend(directory)
    for penalty in (0.0, 2.0):
        got = decoding.beam_search(backend, src, 4, SHORT_LENGTH, penalty, n_best=4)
        for nbest in got:
            keys = [h.normalized_score for h in nbest]
            assert keys == sorted(keys, reverse=True)
        want = reference_decoding.beam_search(ckpt.model, torch.from_numpy(src), 4, SHORT_LENGTH, penalty, n_best=4)
        assert [[h.tokens for h in nb] for nb in got] == [[h.tokens for h in nb] for nb in want]
    assert EOS_ID not in {t for nb in got for h in nb for t in h.tokens}


@pytest.fixture(scope="module")
def wide():
    """A flat random model whose k x vocab candidates are too many to sort whole, so beam search takes the
    block-floor path; one whose logits are all equal (ties across every block); and one whose last token, in the
    short last block (1500 is no multiple of the block length at k = 4 and 2), is often among the best."""
    models = {}
    for name in ("flat", "tied", "last"):
        torch.manual_seed(3)
        from tfm_export.model.transformer import Transformer
        model = Transformer(tiny_config(n_position=24, src_vocab_size=19, trg_vocab_size=1500,
                                        proj_share_weight=False, embs_share_weight=False)).eval()
        with torch.no_grad():
            weight = model.trg_word_prj.weight
            weight.mul_(0.0 if name == "tied" else 3.0)
            weight[EOS_ID] = weight[EOS_ID:EOS_ID + 1].abs().mean(0) * 4
            if name == "last":  # the flat model's favourite token, moved to the last id and made a little stronger
                src = torch.from_numpy(short_sources(19, 5, 0))
                tokens = [t for h in reference_decoding.greedy_decode(model, src, SHORT_LENGTH) for t in h.tokens]
                weight[-1] = weight[max(set(tokens) - {EOS_ID}, key=tokens.count)] * 1.02
        models[name] = model
    return models


@pytest.mark.parametrize("name", ["flat", "tied", "last"])
def test_beam_search_over_a_large_vocabulary_equals_the_reference(wide, name):
    model = wide[name]
    assert 4 * model.config.trg_vocab_size > step.FULL_SORT_WIDTH, "the block-floor path must be the one taken"
    backend = CountingReorders(TorchBackend(model))
    chosen = set()
    for k, count, seed, penalty in ((4, 5, 0, 1.0), (3, 2, 1, 0.6), (2, 3, 2, 2.0)):
        src = short_sources(19, count, seed)
        got = decoding.beam_search(backend, src, k, SHORT_LENGTH, penalty, n_best=k)
        want = reference_decoding.beam_search(model, torch.from_numpy(src), k, SHORT_LENGTH, penalty, n_best=k)
        assert_same_nbest(got, want)
        chosen |= {t for nb in want for h in nb for t in h.tokens}
    if name == "flat":
        assert backend.moved > 10, "beams must reshuffle within inputs"
    if name == "last":
        assert model.config.trg_vocab_size - 1 in chosen, "the short last block's token must be chosen"


def test_log_sum_exp_by_row_blocks_equals_the_whole_array(monkeypatch):
    """_normalizers works a few rows at a time (no second (N, V) array at the memory peak): row by row the same
    float32 operations, so bit-identical to the whole array's, masked rows included; and torch's log-sum-exp."""
    x = np.random.default_rng(0).standard_normal((37, 1000)).astype(np.float32) * 5
    x[3, :500] = -np.inf
    top = x.max(axis=-1, keepdims=True)
    want = np.log(np.exp(x - top).sum(axis=-1, keepdims=True))
    monkeypatch.setattr(step, "NORMALIZER_BYTES", 3 * x.shape[1] * x.itemsize)
    got_top, got = step._normalizers(x)
    assert np.array_equal(got_top, top) and np.array_equal(got, want)
    np.testing.assert_allclose(got_top + got, torch.logsumexp(torch.from_numpy(x), -1, keepdim=True), rtol=1e-6)
