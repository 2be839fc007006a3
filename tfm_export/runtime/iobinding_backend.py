"""ONNX Runtime with IO binding: inputs and outputs are torch tensors on the run device, so on CUDA the
KV cache stays on the GPU between steps (and is reordered there); only logits go to the host for the search.

The same code runs with device "cpu", which is how it is tested on machines without a GPU.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch
from torch import Tensor

from ..core.graph_spec import cache_head_sizes
from ..core.sources import check_source_length, check_target_length
from .cache import CacheState
from .decoding import Candidates, StepRule
from .ort_backend import OrtBackend

NUMPY_DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64}


class OrtBoundBackend:
    """decoding.StepBackend over an OrtBackend's sessions, with every tensor bound on `device`."""

    def __init__(self, base: OrtBackend, device: str = "cuda") -> None:
        self.base, self.config, self.device = base, base.config, torch.device(device)
        self.cache_dtype = torch.float16 if base.cache_dtype == np.float16 else torch.float32
        self.model_dir = base.model_dir
        self.step_calls = 0

    def _run(self, session: ort.InferenceSession, inputs: dict[str, Tensor], outputs: dict[str, Tensor]) -> None:
        binding = session.io_binding()
        kind, index = self.device.type, self.device.index or 0
        for names, bind in ((inputs, binding.bind_input), (outputs, binding.bind_output)):
            for name, t in names.items():
                bind(name, kind, index, NUMPY_DTYPES[t.dtype], tuple(t.shape), t.data_ptr())
        session.run_with_iobinding(binding)

    def _empty(self, *shape: int, dtype: torch.dtype | None = None) -> Tensor:
        """Cache and hidden-state buffers in the graph's cache dtype (fp16 graphs), logits always float32."""
        return torch.empty(shape, dtype=dtype or self.cache_dtype, device=self.device)

    def encode(self, src: np.ndarray) -> CacheState:
        check_source_length(src.shape[1], self.config.n_position)
        cfg, (n, s) = self.config, src.shape
        ids = torch.from_numpy(np.ascontiguousarray(src, dtype=np.int64)).to(self.device)
        mask = (ids != cfg.src_pad_idx).long()
        sizes = cache_head_sizes(cfg)
        cross = [self._empty(n, cfg.n_head, s, d) for d in sizes]
        outputs = {"last_hidden_state": self._empty(n, s, cfg.d_model),
                   **dict(zip(self.base.names.cross_outputs, cross, strict=True))}
        self._run(self.base.encoder, {"input_ids": ids, "attention_mask": mask}, outputs)
        return CacheState(mask, tuple(cross), tuple(self._empty(n, cfg.n_head, 0, d) for d in sizes))

    def step(self, state: CacheState, tokens: np.ndarray, rule: StepRule) -> tuple[CacheState, Candidates]:
        cfg, n, past = self.config, len(tokens), state.past_length
        check_target_length(past + 1, self.config.n_position)
        ids = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64)).to(self.device)[:, None]
        present = [self._empty(n, cfg.n_head, past + 1, d) for d in cache_head_sizes(cfg)]
        logits = self._empty(n, 1, cfg.trg_vocab_size, dtype=torch.float32)
        inputs = {"input_ids": ids, "encoder_attention_mask": state.mask,
                  **dict(zip(self.base.names.self_inputs, state.past, strict=True)),
                  **dict(zip(self.base.names.cross_inputs, state.cross, strict=True))}
        self._run(self.base.decoder, inputs, {"logits": logits,
                                              **dict(zip(self.base.names.self_outputs, present, strict=True))})
        self.step_calls += 1
        return CacheState(state.mask, state.cross, tuple(present)), rule.candidates(logits[:, -1].cpu().numpy())

    def expand(self, state: CacheState, beams: int) -> CacheState:
        return self.select(state, np.repeat(np.arange(len(state.mask)), beams))

    def select(self, state: CacheState, rows: np.ndarray) -> CacheState:
        index = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)
        pick = lambda ts: tuple(t.index_select(0, index) for t in ts)  # noqa: E731
        return CacheState(state.mask.index_select(0, index), pick(state.cross), pick(state.past))

    def permute(self, state: CacheState, rows: np.ndarray) -> CacheState:
        index = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)
        return CacheState(state.mask, state.cross, tuple(t.index_select(0, index) for t in state.past))
