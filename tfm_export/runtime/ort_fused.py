"""ONNX Runtime on the CPU through decoder_step_fused: decoder_step_buffered's buffers, growth, beam reorders
and search, with the step in ONNX Runtime's fused operators. Each layer's cache buffers are bound as both the
graph's past inputs and its present outputs, so GroupQueryAttention writes the new token's keys/values into
them itself: a step copies nothing back."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..core.errors import TfmExportError
from ..core.graph_spec import FUSED_MIN_ONNXRUNTIME, GraphVariant
from .ort_buffered import CAPACITY_STEP, BufferedState, Buffers, OrtBufferedBackend
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

    def _bind(self, state: BufferedState, cache: list[np.ndarray], same_rows: Buffers | None = None) -> Buffers:
        """As decoder_step_buffered's, with each cache buffer's OrtValue bound as its present output too."""
        rows, cfg = state.rows, self.config
        binding = self.decoder.io_binding()
        if same_rows is None:
            buffers = Buffers(binding, np.zeros((rows, 1), np.int64), np.zeros((), np.int64), cache, [],
                              np.zeros((rows, 1, cfg.trg_vocab_size), np.float32), [],
                              np.zeros(rows, np.int32), np.zeros((), np.int32))
        else:
            buffers = replace(same_rows, binding=binding, cache=cache, values=[])
        inputs = {"input_ids": buffers.ids, "encoder_attention_mask": state.mask, "cache_length": buffers.length,
                  "seqlens_k": buffers.filled, "total_sequence_length": buffers.total,
                  **dict(zip(self.names.self_inputs, cache, strict=True)),
                  **dict(zip(self.names.cross_inputs, state.cross, strict=True))}
        bound = {}
        for name, array in inputs.items():
            bound[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
            binding.bind_ortvalue_input(name, bound[name])
        outputs = {"logits": ort.OrtValue.ortvalue_from_numpy(buffers.logits),
                   **{present: bound[past] for past, present in
                      zip(self.names.self_inputs, self.names.self_outputs, strict=True)}}
        for name, value in outputs.items():
            binding.bind_ortvalue_output(name, value)
        buffers.values.extend([*bound.values(), outputs["logits"]])
        return buffers
