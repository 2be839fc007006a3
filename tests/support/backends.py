"""Step backends as the tests open them: through the runtime's one door, by the cache they drive, with the
options a test needs (a small growth step, the fused or the standard step graph); and the stepwise parity check
every export test holds a directory to."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tfm_export.graphs.inputs import random_sources, random_targets
from tfm_export.graphs.parity import compare_stepwise
from tfm_export.runtime.backends import CONCAT, GENERATE, open_backend
from tfm_export.runtime.session import CAPACITY_STEP, DEFAULT_OPTIONS


def step_backend(directory: Path, backend: str = CONCAT, fused: bool = False, cache_step: int = CAPACITY_STEP,
                 **options):
    """The step backend of a model directory by its name (runtime.backend_names); fused: the fused twin of
    decoder_step_search where the directory has it."""
    chosen = dataclasses.replace(DEFAULT_OPTIONS, fused=fused, cache_step=cache_step, **options)
    return open_backend(directory, backend, chosen).backend


def concat_backend(directory: Path, **options):
    """The contract's decoder_step: the backend that runs every graph as the contract describes it."""
    return step_backend(directory, CONCAT, **options)


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
