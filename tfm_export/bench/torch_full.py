"""The benchmark's baseline: the PyTorch model decoding without a cache, as the seed's translator does."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..model.transformer import Transformer, get_pad_mask, get_subsequent_mask
from ..runtime.step import Candidates, Reorders, StepRule


@dataclass(frozen=True)
class FullState:
    enc_output: Tensor  # (N, S, d_model)
    src_mask: Tensor  # (N, 1, S) bool
    prefix: Tensor  # (N, t) target tokens so far, <s> first

    @property
    def rows(self) -> int:
        return len(self.prefix)


class TorchFullBackend(Reorders):
    """StepBackend without a cache: every step runs the decoder over the whole prefix, as the seed's
    translator does. Only the benchmarks use it, as the baseline the cached backends are measured against."""

    def __init__(self, model: Transformer, device: str = "cpu") -> None:
        self.model, self.device, self.config = model.eval().to(device), torch.device(device), model.config

    @torch.no_grad()
    def encode(self, src: np.ndarray) -> FullState:
        enc_output, src_mask = self.model.encode(torch.from_numpy(src).to(self.device))
        return FullState(enc_output, src_mask, torch.empty(len(src), 0, dtype=torch.long, device=self.device))

    @torch.no_grad()
    def step(self, state: FullState, tokens: np.ndarray, rule: StepRule) -> tuple[FullState, Candidates]:
        prefix = torch.cat([state.prefix, torch.from_numpy(tokens).to(self.device)[:, None]], dim=1)
        trg_mask = get_pad_mask(prefix, self.model.trg_pad_idx) & get_subsequent_mask(prefix)
        x = self.model.decoder(prefix, trg_mask, state.enc_output, state.src_mask)
        logits = self.model.project(x)[:, -1].float().cpu().numpy()
        return FullState(state.enc_output, state.src_mask, prefix), rule.candidates(logits)

    def select(self, state: FullState, rows: np.ndarray) -> FullState:
        index = self._index(rows)
        return FullState(state.enc_output.index_select(0, index), state.src_mask.index_select(0, index),
                         state.prefix.index_select(0, index))

    def permute(self, state: FullState, rows: np.ndarray) -> FullState:
        return FullState(state.enc_output, state.src_mask, state.prefix.index_select(0, self._index(rows)))

    def _index(self, rows: np.ndarray) -> Tensor:
        return torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)
