"""The PyTorch reference model with a KV cache (its own ConcatCache), behind the same interface as the graphs:
`tfm-run --backend torch` on a checkpoint, and the tests' model-side oracle for the loops."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ...core.sources import check_source_length, check_target_length
from ...model.cache import ConcatCache
from ...model.transformer import Transformer
from ..counts import WorkCounts
from ..step import Candidates, Reorders, StepRule


@dataclass(frozen=True)
class TorchState:
    src_mask: Tensor  # (N, 1, S) bool
    cross: list[tuple[Tensor, Tensor]]  # per layer (N, nh, S, dk), (N, nh, S, dv)
    past: list[tuple[Tensor, Tensor]]  # per layer (N, nh, P, dk), (N, nh, P, dv)

    @property
    def rows(self) -> int:
        return len(self.src_mask)


class TorchBackend(Reorders):
    """StepBackend with Decoder.step (cached), the same maths as Transformer.forward."""

    def __init__(self, model: Transformer, device: str = "cpu") -> None:
        self.model, self.device = model.eval().to(device), torch.device(device)
        self.config = model.config
        self.counts: WorkCounts | None = None  # given by those who count work

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
    def step(self, state: TorchState, tokens: np.ndarray, rule: StepRule) -> tuple[TorchState, Candidates]:
        check_target_length(state.past[0][0].size(2) + 1, self.config.n_position)
        new = torch.from_numpy(tokens).to(self.device)[:, None]  # (N, 1)
        x, present = self.model.decoder.step(new, ConcatCache(state.past), state.cross, state.src_mask)
        if self.counts is not None:
            self.counts.run(len(tokens))
        logits = self.model.project(x)[:, -1].float().cpu().numpy()  # (N, V)
        return TorchState(state.src_mask, state.cross, present), rule.candidates(logits)

    def select(self, state: TorchState, rows: np.ndarray) -> TorchState:
        index = self._index(rows)
        return TorchState(state.src_mask.index_select(0, index), _pick(state.cross, index), _pick(state.past, index))

    def permute(self, state: TorchState, rows: np.ndarray) -> TorchState:
        return TorchState(state.src_mask, state.cross, _pick(state.past, self._index(rows)))

    def _index(self, rows: np.ndarray) -> Tensor:
        return torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)


def _pick(pairs: list[tuple[Tensor, Tensor]], index: Tensor) -> list[tuple[Tensor, Tensor]]:
    return [(k.index_select(0, index), v.index_select(0, index)) for k, v in pairs]
