"""How fast a whole decoder step can be in ONNX Runtime on this machine: decoder_step_fused (the classic step in
ONNX Runtime's fused CPU operators, graphs.fused) alone, with no search around it, timed at its best over
thread counts and spinning. Its self-attention (GroupQueryAttention over a cache buffer it extends in place)
was the fastest form measured here, against MultiHeadAttention concatenating its past and Attention with Q/K/V
inside. Where the step 1.25x CTranslate2 allows takes less than this, no graph of ONNX Runtime's kernels, and
no loop around them, meets the target."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from torch import nn

from ..core.errors import TfmExportError
from ..core.graph_spec import (
    DEFAULT_OPSET,
    SEQLENS_K,
    TOTAL_SEQUENCE_LENGTH,
    GraphVariant,
    cache_head_sizes,
    cache_names,
    variant_specs,
)
from ..core.variants import describe
from ..graphs.fused import fused_step_graph
from ..runtime.session import SessionOptions, runs_fused_graphs
from .kernel_floor import best_run_ms


def supports(cfg) -> bool:
    return GraphVariant.DECODER_STEP_FUSED in variant_specs(cfg) and runs_fused_graphs()


def step_inputs(model: nn.Module, batch: int, beam: int, cache_length: int,
                source_length: int) -> dict[str, np.ndarray]:
    """decoder_step_fused's inputs for `batch` sources of `beam` rows each after `cache_length` tokens: random
    keys/values (their values do not change the time) in buffers with room for the new token."""
    cfg, rng, rows, names = model.config, np.random.default_rng(0), batch * beam, cache_names(model.config)
    feeds = {"input_ids": np.full((rows, 1), 4, np.int64),
             "encoder_attention_mask": np.ones((batch, source_length), np.int64),
             "cache_length": np.array(min(cache_length, cfg.n_position - 1), np.int64),
             SEQLENS_K: np.full(rows, cache_length, np.int32),
             TOTAL_SEQUENCE_LENGTH: np.array(cache_length + 1, np.int32)}
    for cached, count, length in ((names.self_inputs, rows, cache_length + 1), (names.cross_inputs, batch,
                                                                                 source_length)):
        for name, size in zip(cached, cache_head_sizes(cfg), strict=True):
            feeds[name] = rng.standard_normal((count, cfg.n_head, length, size), dtype=np.float32)
    return feeds


def step_floor_ms(model: nn.Module, batch: int, beam: int, cache_length: int, source_length: int,
                  threads: int = 0) -> dict[str, float]:
    """Best step time (ms) of decoder_step_fused for `batch` sources x `beam` rows after `cache_length` cached
    tokens, per setting: `threads` intra-op threads and one, each spinning within the run and sleeping."""
    if not supports(model.config):
        raise TfmExportError(f"the step floor runs decoder_step_fused, which this model has none of "
                             f"({describe(model.config.variant())}, d_k {model.config.d_k}, d_v "
                             f"{model.config.d_v}); measure a classic config with equal key and value sizes")
    spec = variant_specs(model.config)[GraphVariant.DECODER_STEP_FUSED]
    feeds = step_inputs(model, batch, beam, cache_length, source_length)
    names = cache_names(model.config)
    present = dict(zip(names.self_inputs, names.self_outputs, strict=True)).get  # each buffer, extended in place
    best = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / spec.graph.filename
        # the table's name matters only for sharing it with an encoder, which this graph runs without
        path.write_bytes(fused_step_graph(model, spec, "table", DEFAULT_OPSET).SerializeToString())
        for count in dict.fromkeys((threads, 1)):
            for spinning in (True, False):
                label = f"{count or 'all'} thread{'s' if count != 1 else ''}, {'spinning' if spinning else 'sleeping'}"
                options = SessionOptions(intra_op_threads=count, spinning=spinning, memory_arena=False)  # as tfm-run
                best[label] = best_run_ms(path, feeds, options, present)
    return best
