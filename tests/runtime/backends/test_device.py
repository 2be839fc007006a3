"""The device backend's fixed shapes (runtime/backends/device.py), run on the CPU as a GPU would run them: every
decode held to the reference decoders (greedy and beam, penalties, rows finishing early, ties: the equivalence
tests in test_search_equivalence take it as "device"), and here what CUDA graphs need of it: the same memory for
the same shape from batch to batch, finished rows left in place until half the sources are done, the rules
uploaded only when they change, sources padded to a bucket without changing a token (the reorder and padding
graphs of runtime/backends/device_graphs.py among them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.backends import concat_backend, step_backend
from support.common import short_sources

from tfm_export import Translator
from tfm_export.core.token_rules import TokenRules
from tfm_export.demo import numbers as demo_numbers
from tfm_export.graphs.parity import DEFAULT_TOLERANCE, compare_stepwise
from tfm_export.model import reference_decoding
from tfm_export.runtime import decoding
from tfm_export.runtime.backends import CONCAT, DEVICE, device
from tfm_export.runtime.backends.reference import TorchBackend
from tfm_export.runtime.counts import WorkCounts


def _pointers(work: device.Workspace) -> list[int]:
    return [v.data_ptr() for v in (*work.cache.sets[0], *work.cache.sets[1], *work.io.values(),
                                   work.sources.mask, *work.sources.cross)]


def test_a_shape_keeps_its_memory_from_batch_to_batch(flat):
    """A captured CUDA graph replays on the addresses it was captured with: the second batch of a shape decodes in
    the first one's workspace, bound once."""
    ckpt, directory = flat
    backend = step_backend(directory, DEVICE)
    src = short_sources(19, 4, 0)
    seen = []
    for _ in range(2):
        state = backend.encode(src)
        for _ in range(3):
            state, _ = backend.step(state, np.full(4, ckpt.rules.start), decoding.StepRule(ckpt.rules, 1))
        seen.append((state.work, _pointers(state.work), [id(b) for b in state.work.steps]))
    assert seen[0][0] is seen[1][0] and seen[0][1:] == seen[1][1:]


def test_finished_rows_stay_until_half_the_sources_are_done(flat):
    """Rows that leave the search keep being computed (wasted, never read) while more than half the sources go on;
    then the decode moves to a workspace of the live sources only. Each step's logits are the reference's, for
    the rows the search kept, in its order (rows reordered within their source, as beams are)."""
    ckpt, directory = flat
    ours, reference = step_backend(directory, DEVICE), TorchBackend(ckpt.model)
    ours.counts = WorkCounts()
    src = short_sources(19, 8, 7)
    states = [b.expand(b.encode(src), 2) for b in (ours, reference)]
    every = decoding.StepRule(TokenRules(banned=()), ours.top_k + 1)  # more than the graph's K: logits come back
    rng = np.random.default_rng(0)
    for keep in (None, [0, 1, 2, 3, 5, 4, 8, 9, 12, 13, 14, 15], None, [1, 0, 6, 7], None):
        if keep is not None:
            states = [b.select(s, np.array(keep)) for b, s in zip((ours, reference), states, strict=True)]
            assert states[0].shape.sources == (8 if len(keep) > 8 else 2)
        tokens = rng.integers(4, 19, states[0].rows)
        (states[0], got), (states[1], want) = (b.step(s, tokens, every) for b, s in zip((ours, reference), states,
                                                                                       strict=True))
        np.testing.assert_allclose(got.logits, want.logits, atol=1e-4)
    assert ours.counts.finished_rows == 2 * 4 and states[0].live.tolist() == [0, 1, 2, 3]


def test_rows_finishing_in_a_greedy_batch_decode_as_the_reference(flat):
    ckpt, directory = flat
    backend = step_backend(directory, DEVICE)
    backend.counts = WorkCounts()
    src = short_sources(19, 32, 7)
    got = decoding.greedy(backend, src, 20)
    want = reference_decoding.greedy_decode(ckpt.model, torch.from_numpy(src), 20)
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert len({len(h.tokens) for h in want if h.finished}) >= 2 and backend.counts.finished_rows > 0


def test_the_rules_are_uploaded_only_when_they_change(flat):
    """The vocabulary-sized token bias goes to the device at the first step and when the rules change (</s>
    allowed from the minimum length on), not every step."""
    ckpt, directory = flat
    backend = step_backend(directory, DEVICE, cache_step=64)
    backend.counts = WorkCounts()
    state = backend.encode(short_sources(19, 3, 1))
    for t in range(8):
        state, _ = backend.step(state, np.full(3, ckpt.rules.start), decoding.StepRule(ckpt.rules, 1, t >= 5))
    assert backend.counts.runs == 8 and backend.counts.rule_uploads == 2


@pytest.mark.parametrize("length", [2, 15, 16, 17, 24])
def test_sources_padded_to_a_bucket_decode_as_the_reference(flat, length):
    """Sources padded up to a multiple of SOURCE_BUCKET (at most the model's 24 positions), so batches of near
    lengths share a shape: the padding is masked, and the n-best lists are the reference's."""
    ckpt, directory = flat
    rng = np.random.default_rng(length)
    src = np.concatenate([np.full((2, 1), 2), rng.integers(4, 19, (2, length - 2)), np.full((2, 1), 3)], axis=1)
    backend = step_backend(directory, DEVICE)
    assert backend.encode(src).shape.source_length == min(-(-length // device.SOURCE_BUCKET) * device.SOURCE_BUCKET,
                                                          24)
    got = decoding.beam_search(backend, src, 3, 10, n_best=3)
    want = reference_decoding.beam_search(ckpt.model, torch.from_numpy(src), 3, 10, n_best=3)
    assert [[h.tokens for h in nb] for nb in got] == [[h.tokens for h in nb] for nb in want]


def test_a_state_made_from_given_encoder_outputs_steps_as_pytorch(flat):
    """encoded(): the checks give a backend encoder outputs another backend computed. Uploaded into the padded
    source buffers (7 positions padded to a bucket), the steps that follow match PyTorch's full-sequence forward."""
    ckpt, directory = flat
    backend = step_backend(directory, DEVICE)
    pad = ckpt.config.src_pad_idx
    src = np.array([[2, 5, 6, 7, 8, 9, 3], [2, 10, 11, 3, pad, pad, pad]])
    trg = np.array([[ckpt.rules.start, 4, 5, 6, 7], [ckpt.rules.start, 8, 9, 10, 11]])
    encoded = step_backend(directory, CONCAT).run_encoder(src)
    diffs = compare_stepwise(ckpt.model, backend, src, trg, encoded=encoded)
    assert backend.encoded(src, encoded).shape.source_length == device.SOURCE_BUCKET > src.shape[1]
    assert all(d.within(DEFAULT_TOLERANCE) for d in diffs), diffs


def test_the_device_backend_decodes_the_demo_as_plain_arrays_do(demo_onnx):
    """The GPU path's backend (decoder_step_search with all memory in OrtValues, here on the CPU): the same tokens
    as the contract's decoder_step over NumPy arrays, 48 demo sentences, greedy and beam 4."""
    from tfm_export.core.batching import pad_batch
    from tfm_export.core.tokenizer import BOS_ID, EOS_ID
    from tfm_export.runtime.decoding import beam_search, greedy
    plain, bound = concat_backend(demo_onnx), step_backend(demo_onnx, DEVICE)
    tok = Translator.load(demo_onnx).vocab.source
    src = pad_batch([[BOS_ID, *tok.encode(t), EOS_ID] for t, _ in demo_numbers.held_out_pairs()[:48]])
    assert [h.tokens for h in greedy(plain, src, 40)] == [h.tokens for h in greedy(bound, src, 40)]
    assert [h[0].tokens for h in beam_search(plain, src, 4, 40)] == \
        [h[0].tokens for h in beam_search(bound, src, 4, 40)]
