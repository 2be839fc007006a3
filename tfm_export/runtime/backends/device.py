"""The device-resident cache: decoder_step_search with every cache buffer, mask and cross key/value in OrtValues
on the device (a GPU through the CUDA execution provider), without PyTorch. A step writes the token and length into
small device arrays and copies only the K candidates per row back to the host; the graph writes each new key/value
into the buffers in place. Beam reorders gather the cache's rows into the PingPong's other set on the device, and a
full cache grows by a one-node Pad: Python never touches device memory. With device "cpu" the same code runs on
host OrtValues, which is how it is tested on machines without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from ...core.graph_spec import FORCED_TOKEN, TOKEN_BIAS, TOP_IDS, TOP_LOGPROBS
from ...core.sources import check_source_length, check_target_length
from ..session import CAPACITY_STEP, CUDA_PROVIDER
from ..step import LOGITS_ONLY, Candidates, Reorders, StepRule
from .pingpong import DeviceMemory, PingPong
from .search_step import Rules, SearchSessions, source_groups

SMALL_INPUTS = ("input_ids", "cache_length", TOKEN_BIAS, FORCED_TOKEN)
OUTPUTS = ("logits", TOP_LOGPROBS, TOP_IDS)


@dataclass
class DeviceState:
    """A decode's state, all of it on the device but the host's copies of the decoding-rule arrays."""

    mask: ort.OrtValue  # (B, S) int64, per source
    cross: tuple[ort.OrtValue, ...]  # per layer key/value (B, nh, S, d), per source
    sources: int
    rules: Rules
    length: int = 0
    group: int = 1
    capacity: int = 0
    cache: PingPong | None = None  # made at the first step (beam search expands the rows before it)
    io: dict[str, ort.OrtValue] = field(default_factory=dict)  # the step's small inputs and outputs, for the rows
    bindings: list[ort.IOBinding] = field(default_factory=list)  # per cache set: the decoder bound to it

    @property
    def rows(self) -> int:
        return self.sources * self.group

    @property
    def past_length(self) -> int:
        return self.length


class DeviceBackend(Reorders):
    """StepBackend (and GraphBackend) on decoder_step_search whose memory is all on the sessions' device."""

    def __init__(self, sessions: SearchSessions, capacity_step: int = CAPACITY_STEP) -> None:
        self.sessions, self.capacity_step = sessions, capacity_step
        self.config, self.names, self.top_k = sessions.config, sessions.names, sessions.top_k
        self.decoder, self.model_dir = sessions.decoder, sessions.model_dir
        providers = self.decoder.get_providers()
        self.device = "cuda" if CUDA_PROVIDER in providers else "cpu"
        self.memory = DeviceMemory(self.device, providers, sessions.cache_dtype)
        self.step_calls = 0

    def run_encoder(self, src: np.ndarray) -> dict[str, np.ndarray]:
        return self.sessions.run_encoder(src)

    def encode(self, src: np.ndarray) -> DeviceState:
        check_source_length(src.shape[1], self.config.n_position)
        mask = (src != self.config.src_pad_idx).astype(np.int64)
        binding = self.sessions.encoder.io_binding()
        binding.bind_cpu_input("input_ids", src.astype(np.int64))
        binding.bind_cpu_input("attention_mask", mask)
        for name in self.names.cross_outputs:
            binding.bind_output(name, self.device, 0)
        self.sessions.encoder.run_with_iobinding(binding)
        return DeviceState(self.memory.upload(mask), tuple(binding.get_outputs()), len(src),
                           Rules(np.zeros(self.config.trg_vocab_size, np.float32)))

    def step(self, state: DeviceState, tokens: np.ndarray, rule: StepRule) -> tuple[DeviceState, Candidates]:
        check_target_length(state.length + 1, self.config.n_position)
        if state.length == state.capacity:
            self._grow(state)
        io = state.io
        io["input_ids"].update_inplace(np.ascontiguousarray(tokens.reshape(-1, 1), dtype=np.int64))
        io["cache_length"].update_inplace(np.array(state.length, np.int64))
        state.rules.apply(rule)
        if state.rules.changed:  # a vocabulary-sized upload, only when the rules change
            io[TOKEN_BIAS].update_inplace(state.rules.bias)
            io[FORCED_TOKEN].update_inplace(state.rules.forced)
        self.decoder.run_with_iobinding(state.bindings[state.cache.current])
        self.step_calls += 1
        state.length += 1
        if rule.count > self.top_k:
            return state, rule.candidates(io["logits"].numpy()[:, 0])
        return state, Candidates(io[TOP_LOGPROBS].numpy(), io[TOP_IDS].numpy())

    def run_step(self, state: DeviceState, input_ids: np.ndarray) -> tuple[DeviceState, np.ndarray]:
        """(N, T) tokens, one call each -> (N, T, V) logits, copied to the host."""
        logits = []
        for t in range(input_ids.shape[1]):
            state, _ = self.step(state, input_ids[:, t], LOGITS_ONLY)
            logits.append(state.io["logits"].numpy()[:, 0])
        return state, np.stack(logits, axis=1)

    def permute(self, state: DeviceState, rows: np.ndarray) -> DeviceState:
        """The cache's rows gathered on the device into the other set, which becomes the current one (both sets
        are bound for these rows)."""
        rows = np.asarray(rows)
        if state.cache is not None and (rows != np.arange(len(rows))).any():
            state.cache.gather(rows, state.capacity)
        return state

    def select(self, state: DeviceState, rows: np.ndarray) -> DeviceState:
        rows = np.asarray(rows)
        sources, group = source_groups(rows // state.group)
        if not np.array_equal(sources, np.arange(state.sources)):
            state.cross, state.mask = self.memory.gather_sources(state.cross, state.mask, sources)
        state.sources, state.group = len(sources), group
        if state.cache is None:
            return state
        if len(rows) > state.cache.rows:  # wider (beam search's start after a step): a PingPong for more rows
            wider = self._allocate(len(rows), state.capacity)
            state.cache.gather(rows, state.capacity, into=wider)
            state.cache = wider
        else:
            state.cache.gather(rows, state.capacity)
        self._bind(state)
        return state

    def _allocate(self, rows: int, capacity: int) -> PingPong:
        cfg = self.config
        return PingPong.allocate(self.memory, rows, cfg.n_layers, cfg.n_head, (cfg.d_k, cfg.d_v), capacity)

    def _grow(self, state: DeviceState) -> None:
        """Room for capacity_step more positions: the current set padded into a new PingPong."""
        capacity = min(state.length + self.capacity_step, self.config.n_position)
        state.cache = state.cache.grown(state.capacity, capacity) if state.cache is not None else \
            self._allocate(state.rows, capacity)
        state.capacity = capacity
        self._bind(state)

    def _bind(self, state: DeviceState) -> None:
        """Both sets' bindings for the current rows: each layer's cache tensors as the past inputs and as the
        present outputs (written in place), with the step's small inputs and outputs, made anew only when the row
        count changed."""
        rows, vocab = state.rows, self.config.trg_vocab_size
        if state.io.get("input_ids") is None or state.io["input_ids"].shape()[0] != rows:
            state.io = {"input_ids": self.memory.upload(np.zeros((rows, 1), np.int64)),
                        "cache_length": self.memory.upload(np.zeros((), np.int64)),
                        TOKEN_BIAS: self.memory.upload(state.rules.bias),
                        FORCED_TOKEN: self.memory.upload(state.rules.forced),
                        "logits": self.memory.upload(np.zeros((rows, 1, vocab), np.float32)),
                        TOP_LOGPROBS: self.memory.upload(np.zeros((rows, self.top_k), np.float32)),
                        TOP_IDS: self.memory.upload(np.zeros((rows, self.top_k), np.int64))}
        state.bindings = []
        for side in range(2):
            binding = self.decoder.io_binding()
            for name in SMALL_INPUTS:
                binding.bind_ortvalue_input(name, state.io[name])
            binding.bind_ortvalue_input("encoder_attention_mask", state.mask)
            for name, value in zip(self.names.cross_inputs, state.cross, strict=True):
                binding.bind_ortvalue_input(name, value)
            for name in OUTPUTS:
                binding.bind_ortvalue_output(name, state.io[name])
            tensors = state.cache.tensors(side, state.capacity)
            for past, present, (address, shape) in zip(self.names.self_inputs, self.names.self_outputs, tensors,
                                                       strict=True):
                binding.bind_input(past, self.device, 0, self.memory.element, shape, address)
                binding.bind_output(present, self.device, 0, self.memory.element, shape, address)
            state.bindings.append(binding)
