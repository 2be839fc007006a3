"""ONNX Runtime on the CPU through decoder_step_fused: decoder_step_buffered's buffers, growth, beam reorders
and search, with the step in ONNX Runtime's fused operators. Each layer's cache buffers are bound as both the
graph's past inputs and its present outputs, so GroupQueryAttention writes the new token's keys/values into
them itself: a step copies nothing back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..core.errors import TfmExportError
from ..core.graph_spec import FUSED_MIN_ONNXRUNTIME, GraphVariant
from .ort_buffered import CAPACITY_STEP, Buffers, OrtBufferedBackend, layer_views
from .session import DEFAULT_OPTIONS, SessionOptions, runs_fused_graphs


class OrtFusedBackend(OrtBufferedBackend):
    """decoding.StepBackend on an encoder and a decoder_step_fused session."""

    variant = GraphVariant.DECODER_STEP_FUSED

    @classmethod
    def open(cls, directory: Path, options: SessionOptions = DEFAULT_OPTIONS,
             capacity_step: int = CAPACITY_STEP) -> OrtFusedBackend:
        if not runs_fused_graphs():
            raise TfmExportError(f"{directory}: {cls.variant.filename} needs onnxruntime >= "
                                 f"{'.'.join(map(str, FUSED_MIN_ONNXRUNTIME))} (this is {ort.__version__}); upgrade "
                                 "it, or decode with decoder_step_buffered (tfm-run translate --no-fused)")
        return super().open(directory, options, capacity_step)

    def _new_buffers(self, binding: ort.IOBinding, rows: int, blocks: list[np.ndarray]) -> Buffers:
        """No new-key arrays (the graph writes the cache itself); GroupQueryAttention's counts instead."""
        return Buffers(binding, np.zeros((rows, 1), np.int64), np.zeros((), np.int64), blocks,
                       layer_views(blocks, rows), [],
                       np.zeros((rows, 1, self.config.trg_vocab_size), np.float32), [],
                       np.zeros(rows, np.int32), np.zeros((), np.int32))
