"""Step backends as the tests open them: through the runtime's one door, by name, with the options a test needs
(a small growth step, the fused or the standard step graph); a wrapper that counts their beam reorders, the n-best
comparison every search test makes, and the stepwise parity check every export test holds a directory to."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from tfm_export.core.hypothesis import Hypothesis
from tfm_export.core.token_rules import TokenRules
from tfm_export.graphs.inputs import random_sources, random_targets
from tfm_export.graphs.parity import compare_stepwise
from tfm_export.runtime import step
from tfm_export.runtime.backends import CONCAT, GENERATE, open_backend
from tfm_export.runtime.backends.concat import ConcatBackend
from tfm_export.runtime.counts import WorkCounts
from tfm_export.runtime.search import LoopSearcher
from tfm_export.runtime.session import DEFAULT_OPTIONS
from tfm_export.runtime.step_graph import CAPACITY_STEP, StepOptions
from tfm_export.runtime.translator import Translator

SHORT_LENGTH = 12  # tokens the search tests decode: beams reshuffle and finish within it
ONE_CANDIDATE_RULE = step.StepRule(TokenRules(banned=()), 1)  # a step whose logits are compared: nothing masked


class CountingReorders:
    """A backend wrapper that counts beam reshuffles within inputs (rows that move) and the steps whose
    candidates came from the graph, to prove the tests exercise what they test."""

    def __init__(self, backend) -> None:
        self.backend, self.moved = backend, 0

    def encode(self, src):
        return self.backend.encode(src)

    def step(self, state, tokens, rule):
        return self.backend.step(state, tokens, rule)

    def expand(self, state, beams):
        return self.backend.expand(state, beams)

    def select(self, state, rows):
        return self.backend.select(state, rows)

    def permute(self, state, rows):
        self.moved += int((np.asarray(rows) != np.arange(len(rows))).sum())
        return self.backend.permute(state, rows)


def assert_same_nbest(got: list[list[Hypothesis]], want: list[list[Hypothesis]]) -> None:
    assert [[h.tokens for h in nb] for nb in got] == [[h.tokens for h in nb] for nb in want]
    assert [[h.finished for h in nb] for nb in got] == [[h.finished for h in nb] for nb in want]
    assert np.allclose([h.score for nb in got for h in nb], [h.score for nb in want for h in nb], atol=1e-4)


def step_backend(directory: Path, backend: str = CONCAT, fused: bool = False, cache_step: int = CAPACITY_STEP,
                 **options):
    """The step backend of a model directory by its name (runtime.backend_names); fused: the fused twin of
    decoder_step_search where the directory has it."""
    chosen = dataclasses.replace(DEFAULT_OPTIONS, **options)
    return open_backend(directory, backend, chosen, step=StepOptions(fused, cache_step)).backend


def concat_backend(directory: Path, **options):
    """The contract's decoder_step: the backend that runs every graph as the contract describes it."""
    return step_backend(directory, CONCAT, **options)


class RecordingBackend(ConcatBackend):
    """The real ONNX Runtime backend, noting the shape of every decoder_step call."""

    calls: list[tuple[int, int, int]]

    def run_step(self, state, input_ids):
        self.calls.append((input_ids.shape[0], state.past_length, input_ids.shape[1]))
        return super().run_step(state, input_ids)


def recording_translator(directory):
    """A Translator over the concat backend of `directory` that records its decoder calls, and that backend."""
    backend = concat_backend(directory)
    backend.__class__ = RecordingBackend
    backend.calls, backend.counts = [], WorkCounts()
    base = Translator.load(directory)
    return Translator(LoopSearcher(backend), base.vocab, base.config), backend


def assert_stepwise_parity(ckpt, directory: Path, batch: int, atol: float = 1e-4) -> None:
    cfg = ckpt.config
    src = random_sources(cfg.src_vocab_size, batch, 12, seed=batch)
    if batch > 1:
        assert (src == 1).any(), "the batch must contain padded sources"
    trg = random_targets(cfg.trg_vocab_size, batch, 30, seed=batch)
    diffs = compare_stepwise(ckpt.model, concat_backend(directory), src, trg, steps=30)
    assert len(diffs) == 4 and "30 steps" in diffs[2].name
    for diff in diffs:
        assert diff.max_abs <= atol, diff


def generate_searcher(directory: Path):
    """generate.onnx's searcher, opened as `tfm-run --backend onnxruntime-generate` opens it."""
    return open_backend(directory, GENERATE).searcher
