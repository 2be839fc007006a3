"""The PyTorch backend: the reference model with a KV cache, behind the same interface as ONNX Runtime."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..core.sources import check_source_length, check_target_length
from ..model.transformer import Transformer


@dataclass(frozen=True)
class TorchState:
    src_mask: Tensor  # (N, 1, S) bool
    cross: list[tuple[Tensor, Tensor]]  # per layer (N, nh, S, dk), (N, nh, S, dv)
    past: list[tuple[Tensor, Tensor]]  # per layer (N, nh, P, dk), (N, nh, P, dv)


class TorchBackend:
    """Implements decoding.StepBackend with Decoder.step (cached), the same maths as Transformer.forward."""

    def __init__(self, model: Transformer, device: str = "cpu") -> None:
        self.model, self.device = model.eval().to(device), torch.device(device)
        self.config = model.config
        self.step_calls = 0

    @torch.no_grad()
    def encode(self, src: np.ndarray) -> TorchState:
        check_source_length(src.shape[1], self.config.n_position)
        ids = torch.from_numpy(src).to(self.device)
        enc_output, src_mask = self.model.encode(ids)
        cfg = self.config
        empty = [(enc_output.new_zeros(len(src), cfg.n_head, 0, cfg.d_k),
                  enc_output.new_zeros(len(src), cfg.n_head, 0, cfg.d_v)) for _ in range(cfg.n_layers)]
        return TorchState(src_mask, self.model.decoder.cross_keys_values(enc_output), empty)

    @torch.no_grad()
    def step(self, state: TorchState, tokens: np.ndarray) -> tuple[TorchState, np.ndarray]:
        check_target_length(state.past[0][0].size(2) + 1, self.config.n_position)
        new = torch.from_numpy(tokens).to(self.device)[:, None]  # (N, 1)
        x, present = self.model.decoder.step(new, state.past, state.cross, state.src_mask)
        self.step_calls += 1
        logits = self.model.project(x)[:, -1].float().cpu().numpy()  # (N, V)
        return TorchState(state.src_mask, state.cross, present), logits

    def reorder(self, state: TorchState, rows: np.ndarray, same_sources: bool = False) -> TorchState:
        index = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)
        pick = lambda pairs: [(k.index_select(0, index), v.index_select(0, index)) for k, v in pairs]  # noqa: E731
        if same_sources:
            return TorchState(state.src_mask, state.cross, pick(state.past))
        return TorchState(state.src_mask.index_select(0, index), pick(state.cross), pick(state.past))
