"""The in-place backend (runtime/backends/inplace.py): decoder_step_search's cache in host buffers, all layers' keys in
one block and values in another, rows moved in pieces, buffers grown in their own memory, rows grouped per source (the
sessions it shares with the device backend: runtime/backends/decoder_step_search.py). Its decodes are held to the
reference decoders with every other backend in test_search_equivalence; here, what only this backend does, each against
the reference model or NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.backends import ONE_CANDIDATE_RULE, SHORT_LENGTH, CountingReorders, assert_same_nbest, step_backend
from support.common import short_sources

from tfm_export.core.tokenizer import BOS_ID, FIRST_TOKEN_ID
from tfm_export.model import reference_decoding
from tfm_export.runtime import decoding
from tfm_export.runtime.backends import INPLACE, inplace
from tfm_export.runtime.backends.inplace import gathered, layer_views, move_order, widen
from tfm_export.runtime.backends.reference import TorchBackend
from tfm_export.runtime.step_graph import FUSED, SEARCH
from tfm_export.runtime.step_inputs import source_groups


def test_beam_reorders_in_one_row_pieces_equal_the_reference(flat, monkeypatch):
    """The search backend copies moved rows in pieces (move_order): here one row per piece wherever a cut is safe."""
    monkeypatch.setattr(inplace, "REORDER_BYTES", 1)
    ckpt, directory = flat
    backend = CountingReorders(step_backend(directory, INPLACE, cache_step=3))
    for k, count, seed in ((4, 7, 0), (3, 5, 2)):
        src = short_sources(ckpt.config.src_vocab_size, count, seed)
        got = decoding.beam_search(backend, src, k, SHORT_LENGTH, 0.6, n_best=k)
        assert_same_nbest(got, reference_decoding.beam_search(ckpt.model, torch.from_numpy(src), k, SHORT_LENGTH,
                                                              0.6, n_best=k))
    assert backend.moved > 20


@pytest.mark.parametrize("seed", range(4))
def test_move_order_pieces_copied_in_turn_equal_one_gather(seed):
    """Row i takes row rows[i]: beams shuffled within inputs of k rows, and any mapping at all."""
    rng = np.random.default_rng(seed)
    for trial in range(300):
        if trial % 2:
            k, inputs = int(rng.integers(1, 6)), int(rng.integers(1, 12))
            rows = np.concatenate([a * k + rng.integers(0, k, size=k) for a in range(inputs)])
        else:
            rows = rng.integers(0, 20, size=20)
        moved = np.flatnonzero(rows != np.arange(len(rows)))
        pieces = move_order(rows, moved, int(rng.integers(1, 5)))
        cache = rng.standard_normal((len(rows), 3))
        want = cache[rows]
        for piece in pieces:
            cache[piece] = cache[rows[piece]]
        assert np.array_equal(cache, want) and np.array_equal(np.concatenate([moved[:0], *pieces]), moved)


@pytest.mark.parametrize("graph", [SEARCH, FUSED])
def test_growing_cache_buffers_grow_in_place(flat, monkeypatch, graph):
    """When the buffers fill up they grow in their own memory: the same arrays, no new cache-sized array
    allocated and the other bound arrays (logits, the top candidates) kept, so growing never holds a second copy
    of any tensor; the logits after growing still equal the reference (test_beam_search_equals_the_reference...)."""
    backend = step_backend(flat[1], INPLACE, fused=graph is FUSED, cache_step=3)
    state, tokens = backend.encode(short_sources(19, 4, 0)), np.full(4, BOS_ID, np.int64)
    for _ in range(3):
        state, _ = backend.step(state, tokens, ONE_CANDIDATE_RULE)
    before = state.buffers
    made, zeros = [], np.zeros
    monkeypatch.setattr(np, "zeros", lambda *args, **kwargs: made.append(args) or zeros(*args, **kwargs))
    state, _ = backend.step(state, tokens, ONE_CANDIDATE_RULE)
    monkeypatch.undo()
    assert state.buffers.cache[0].shape[2] == 6, "the step must have grown the buffers"
    assert all(a is b for a, b in zip(state.buffers.blocks, before.blocks, strict=True)) and not made
    assert state.buffers.logits is before.logits and state.buffers.top is before.top


@pytest.mark.parametrize("shape, capacity", [((5, 3, 4, 2), 7), ((1, 1, 1, 1), 2), ((6, 2, 5, 3), 6),
                                             ((3, 2, 16, 4), 100), ((2, 4, 3, 8), 3), ((7, 2, 3, 4), 4)])
@pytest.mark.parametrize("piece_rows", [1, 2, 3, 100])
def test_widen_moves_every_position_to_its_place(shape, capacity, piece_rows):
    """Rows move within one allocation in pieces, so later pieces overlap earlier ones' old places and a piece
    overlaps itself: against np.pad, for pieces of one row, of several (a short last one) and of all rows."""
    cache = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = np.pad(cache, ((0, 0), (0, 0), (0, max(0, capacity - shape[2])), (0, 0)))
    got = widen(cache, capacity, piece_rows * cache[0].nbytes)
    assert got is cache and np.array_equal(got, want)


@pytest.mark.parametrize("sources, expected", [
    ([0, 0, 1, 1, 2, 2], ([0, 1, 2], 2)), ([3, 1], ([3, 1], 1)), ([0, 0, 0, 1, 2, 2], ([0, 0, 0, 1, 2, 2], 1)),
    ([1, 1, 0, 0, 1, 1], ([1, 0, 1], 2)), ([4], ([4], 1))])
def test_rows_are_grouped_per_source_only_in_equal_consecutive_groups(sources, expected):
    got, group = source_groups(np.array(sources))
    assert (got.tolist(), group) == expected


@pytest.mark.parametrize("graph", [SEARCH, FUSED])
def test_rows_in_any_grouping_give_the_reference_logits(flat, graph):
    """decoder_step_search takes the encoder's keys/values once per source and its rows in equal groups per
    source (a source's beams); other row selections fall back to a group per row. After each selection the
    logits equal the reference model's on the same rows: expansions, dropped sources, unequal groups."""
    ckpt, directory = flat
    ours, reference = step_backend(directory, INPLACE, fused=graph is FUSED), TorchBackend(ckpt.model)
    src = short_sources(ckpt.config.src_vocab_size, 3, 4)
    rng = np.random.default_rng(0)
    for rows, later, groups in (([0, 0, 1, 1, 2, 2], [2, 3, 4, 5], (2, 2)), ([0, 0, 0, 1, 2, 2], [5, 0, 1], (1, 1)),
                                ([2, 0, 1], [0, 0, 1, 1, 2, 2], (1, 2)), ([1, 1, 1], [2, 1, 0], (3, 3))):
        states = [b.select(b.encode(src), np.array(rows)) for b in (ours, reference)]
        assert states[0].group == groups[0]
        for t in range(4):
            if t == 2:
                states = [b.select(s, np.array(later)) for b, s in zip((ours, reference), states, strict=True)]
                assert states[0].group == groups[1]
            tokens = rng.integers(FIRST_TOKEN_ID, ckpt.config.trg_vocab_size, states[0].rows)
            (states[0], got) = ours.step(states[0], tokens, ONE_CANDIDATE_RULE)
            (states[1], want) = reference.step(states[1], tokens, ONE_CANDIDATE_RULE)
            np.testing.assert_allclose(got.logits, want.logits, atol=1e-4)


def test_cache_blocks_take_every_layers_rows_and_own_their_memory():
    """The buffered decoders keep all layers' keys in one block and all values in another: each layer's tensor
    is a view of its rows (what is bound to the session), and a gather of rows takes them in every layer into
    an array of its own, which widen can then resize in place."""
    layers, rows, taken = 3, 4, np.array([2, 2, 0])
    blocks = [np.random.default_rng(seed).standard_normal((layers * rows, 2, 5, 3)).astype(np.float32)
              for seed in (0, 1)]
    views = layer_views(blocks, rows)
    assert len(views) == 2 * layers and all(np.shares_memory(v, blocks[i % 2]) for i, v in enumerate(views))
    for i, view in enumerate(views):
        assert np.array_equal(view, blocks[i % 2][i // 2 * rows:(i // 2 + 1) * rows])
    for block in blocks:
        got = gathered(block, rows, taken)
        want = np.concatenate([block[layer * rows:(layer + 1) * rows][taken] for layer in range(layers)])
        assert np.array_equal(got, want) and got.flags.owndata
        assert widen(got, 7).shape == (layers * len(taken), 2, 7, 3)
