"""The PyTorch backend: the reference model with a KV cache, behind the same interface as ONNX Runtime."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .errors import InputTextError
from .model import Transformer, get_pad_mask, get_subsequent_mask


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
        if src.shape[1] > self.config.n_position:
            raise InputTextError(f"source of {src.shape[1]} tokens (with <s> and </s>) is longer than the model's "
                                 f"{self.config.n_position} positions")
        ids = torch.from_numpy(src).to(self.device)
        enc_output, src_mask = self.model.encode(ids)
        cfg = self.config
        empty = [(enc_output.new_zeros(len(src), cfg.n_head, 0, cfg.d_k),
                  enc_output.new_zeros(len(src), cfg.n_head, 0, cfg.d_v)) for _ in range(cfg.n_layers)]
        return TorchState(src_mask, self.model.decoder.cross_keys_values(enc_output), empty)

    @torch.no_grad()
    def step(self, state: TorchState, tokens: np.ndarray) -> tuple[TorchState, np.ndarray]:
        if state.past[0][0].size(2) + 1 > self.config.n_position:
            raise InputTextError(f"decoding past {self.config.n_position} target positions; lower --max-length")
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



@dataclass(frozen=True)
class FullState:
    enc_output: Tensor  # (N, S, d_model)
    src_mask: Tensor  # (N, 1, S) bool
    prefix: Tensor  # (N, t) target tokens so far, <s> first


class TorchFullBackend:
    """StepBackend without a cache: every step runs the decoder over the whole prefix, as the seed's
    translator does. Only the benchmarks use it, as the baseline the cached backends are measured against."""

    def __init__(self, model: Transformer, device: str = "cpu") -> None:
        self.model, self.device, self.config = model.eval().to(device), torch.device(device), model.config

    @torch.no_grad()
    def encode(self, src: np.ndarray) -> FullState:
        enc_output, src_mask = self.model.encode(torch.from_numpy(src).to(self.device))
        return FullState(enc_output, src_mask, torch.empty(len(src), 0, dtype=torch.long, device=self.device))

    @torch.no_grad()
    def step(self, state: FullState, tokens: np.ndarray) -> tuple[FullState, np.ndarray]:
        prefix = torch.cat([state.prefix, torch.from_numpy(tokens).to(self.device)[:, None]], dim=1)
        trg_mask = get_pad_mask(prefix, self.model.trg_pad_idx) & get_subsequent_mask(prefix)
        x = self.model.decoder(prefix, trg_mask, state.enc_output, state.src_mask)
        return FullState(state.enc_output, state.src_mask, prefix), self.model.project(x)[:, -1].float().cpu().numpy()

    def reorder(self, state: FullState, rows: np.ndarray, same_sources: bool = False) -> FullState:
        index = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)
        prefix = state.prefix.index_select(0, index)
        if same_sources:
            return FullState(state.enc_output, state.src_mask, prefix)
        return FullState(state.enc_output.index_select(0, index), state.src_mask.index_select(0, index), prefix)
