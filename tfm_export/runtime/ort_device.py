"""ONNX Runtime decoding that lives on the device (a GPU through the CUDA execution provider), without PyTorch:
decoder_step_search with every cache buffer, mask and cross key/value in OrtValues on the device, bound once per
row set. A step copies the token and length into small device arrays and only the K candidates per row back to
the host; the graph writes each new key/value into the buffers in place. Beam reorders gather the buffers' rows
on the device into a second set (ping-pong) with a one-node graph, and a full cache grows by a one-node Pad
(runtime.device_graphs): Python never touches device memory. With device "cpu" the same code runs on host
OrtValues, which is how it is tested on machines without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from ..core.graph_spec import FORCED_TOKEN, TOKEN_BIAS, TOP_IDS, TOP_LOGPROBS
from ..core.sources import check_source_length, check_target_length
from .decoding import Candidates, StepRule
from .device_graphs import gather_model, pad_model
from .ort_search import LOGITS_ONLY, OrtSearchBackend, Rules, source_groups

# a block as stored (layers * rows, nh, capacity, d) and as gathered (layers, rows, nh, capacity, d); a source's
# cross keys/values (sources, nh, S, d) and mask (sources, S)
BLOCK_RANK, LAYERS_RANK, CROSS_RANK, MASK_RANK = 4, 5, 4, 2
POSITIONS_AXIS = 2


@dataclass
class Side:
    """One of the two buffer sets: keys and values of every layer, (layers * rows, nh, capacity, d) each, bound
    to the decoder for the current rows (`binding`) with the step's own small inputs and outputs."""

    blocks: list[ort.OrtValue]
    binding: ort.IOBinding | None = None


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
    sides: list[Side] = field(default_factory=list)  # empty until the first step
    current: int = 0  # the side holding the cache
    io: dict[str, ort.OrtValue] = field(default_factory=dict)  # the step's inputs and outputs, for the rows

    @property
    def rows(self) -> int:
        return self.sources * self.group

    @property
    def past_length(self) -> int:
        return self.length


class OrtDeviceBackend(OrtSearchBackend):
    """decoding.StepBackend on decoder_step_search whose memory is all on `device` (options.device)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.device = "cuda" if "CUDAExecutionProvider" in self.decoder.get_providers() else "cpu"
        layers, mask = (self.cache_dtype, LAYERS_RANK), (np.dtype(np.int64), MASK_RANK)
        providers = self.decoder.get_providers()
        self.gather_rows = ort.InferenceSession(gather_model([layers, layers], axis=1), providers=providers)
        crosses = [(self.cache_dtype, CROSS_RANK)] * len(self.names.cross_inputs)
        self.gather_sources = ort.InferenceSession(gather_model([*crosses, mask], axis=0), providers=providers)
        block = (self.cache_dtype, BLOCK_RANK)
        self.pad = ort.InferenceSession(pad_model([block, block], axis=POSITIONS_AXIS), providers=providers)

    def _on_device(self, array: np.ndarray) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.device, 0)

    def encode(self, src: np.ndarray) -> DeviceState:
        check_source_length(src.shape[1], self.config.n_position)
        mask = (src != self.config.src_pad_idx).astype(np.int64)
        binding = self.encoder.io_binding()
        binding.bind_cpu_input("input_ids", src.astype(np.int64))
        binding.bind_cpu_input("attention_mask", mask)
        for name in self.names.cross_outputs:
            binding.bind_output(name, self.device, 0)
        self.encoder.run_with_iobinding(binding)
        return DeviceState(self._on_device(mask), tuple(binding.get_outputs()), len(src),
                           Rules(np.zeros(self.config.trg_vocab_size, np.float32)))

    def step(self, state: DeviceState, tokens: np.ndarray, rule: StepRule) -> tuple[DeviceState, Candidates]:
        check_target_length(state.length + 1, self.config.n_position)
        if state.length == state.capacity:
            self._grow(state)
        io = state.io
        io["input_ids"].update_inplace(np.ascontiguousarray(tokens.reshape(-1, 1), dtype=np.int64))
        io["cache_length"].update_inplace(np.array(state.length, np.int64))
        state.rules.apply(rule)
        io[TOKEN_BIAS].update_inplace(state.rules.bias)
        io[FORCED_TOKEN].update_inplace(state.rules.forced)
        self.decoder.run_with_iobinding(state.sides[state.current].binding)
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

    def expand(self, state: DeviceState, beams: int) -> DeviceState:
        if not state.sides:  # before the first step: the rows are only a count so far
            state.group *= beams
            return state
        return self.select(state, np.repeat(np.arange(state.rows), beams))

    def permute(self, state: DeviceState, rows: np.ndarray) -> DeviceState:
        """The cache's rows gathered on the device into the other side, which becomes the current one (both sides
        are bound for these rows)."""
        rows = np.asarray(rows)
        if state.sides and (rows != np.arange(len(rows))).any():
            self._gather_into(state.sides[state.current].blocks, state.sides[1 - state.current].blocks, rows,
                              state.rows)
            state.current = 1 - state.current
        return state

    def select(self, state: DeviceState, rows: np.ndarray) -> DeviceState:
        rows = np.asarray(rows)
        sources, group = source_groups(rows // state.group)
        old_rows = state.rows
        if not np.array_equal(sources, np.arange(state.sources)):
            binding = self.gather_sources.io_binding()
            for i, value in enumerate((*state.cross, state.mask)):
                binding.bind_ortvalue_input(f"x{i}", value)
                binding.bind_output(f"y{i}", self.device, 0)
            binding.bind_cpu_input("rows", sources.astype(np.int64))
            self.gather_sources.run_with_iobinding(binding)
            *cross, state.mask = binding.get_outputs()
            state.cross = tuple(cross)
        state.sources, state.group = len(sources), group
        if not state.sides:
            return state
        if len(rows) > old_rows:  # wider (beam search's start after a step): sides for the new row count
            wider = [self._zeros(len(rows), state.capacity) for _ in range(2)]
            self._gather_into(state.sides[state.current].blocks, wider[0], rows, old_rows)
            state.sides, state.current = [Side(blocks) for blocks in wider], 0
        else:
            self._gather_into(state.sides[state.current].blocks, state.sides[1 - state.current].blocks, rows,
                              old_rows)
            state.current = 1 - state.current
        self._bind(state)
        return state

    def _gather_into(self, source: list[ort.OrtValue], target: list[ort.OrtValue], rows: np.ndarray,
                     old_rows: int) -> None:
        """Each layer's rows `rows` of the source blocks (old_rows a layer) into the target blocks' first rows."""
        binding = self.gather_rows.io_binding()
        for i, (block, into) in enumerate(zip(source, target, strict=True)):
            shape = self._layers_view(block, old_rows)
            binding.bind_input(f"x{i}", self.device, 0, self.cache_dtype, shape, block.data_ptr())
            binding.bind_output(f"y{i}", self.device, 0, self.cache_dtype, (shape[0], len(rows), *shape[2:]),
                                into.data_ptr())
        binding.bind_cpu_input("rows", rows.astype(np.int64))
        self.gather_rows.run_with_iobinding(binding)

    def _layers_view(self, block: ort.OrtValue, rows: int) -> tuple[int, ...]:
        _, heads, capacity, size = block.shape()
        return (self.config.n_layers, rows, heads, capacity, size)

    def _zeros(self, rows: int, capacity: int) -> list[ort.OrtValue]:
        """Blocks of zeros (the graph reads unfilled positions, so they must be finite), made on the device by
        padding empty ones."""
        cfg = self.config
        empty = [self._on_device(np.zeros((cfg.n_layers * rows, cfg.n_head, 0, size), self.cache_dtype))
                 for size in (cfg.d_k, cfg.d_v)]
        return self._padded(empty, capacity)

    def _padded(self, blocks: list[ort.OrtValue], capacity: int) -> list[ort.OrtValue]:
        """The blocks with zero positions added up to `capacity`, in new device memory."""
        binding = self.pad.io_binding()
        for i, block in enumerate(blocks):
            binding.bind_ortvalue_input(f"x{i}", block)
            binding.bind_output(f"y{i}", self.device, 0)
        pads = np.zeros(2 * BLOCK_RANK, np.int64)
        pads[BLOCK_RANK + POSITIONS_AXIS] = capacity - blocks[0].shape()[POSITIONS_AXIS]  # at the end of the axis
        binding.bind_cpu_input("pads", pads)
        self.pad.run_with_iobinding(binding)
        return binding.get_outputs()

    def _grow(self, state: DeviceState) -> None:
        """Room for capacity_step more positions: the current side padded, the other made anew at that size."""
        capacity = min(state.length + self.capacity_step, self.config.n_position)
        current = self._padded(state.sides[state.current].blocks, capacity) if state.sides else \
            self._zeros(state.rows, capacity)
        state.sides = [Side(current), Side(self._zeros(state.rows, capacity))]
        state.current, state.capacity = 0, capacity
        self._bind(state)

    def _bind(self, state: DeviceState) -> None:
        """Both sides' bindings for the current rows: each layer's buffers (views of the blocks) as the past inputs
        and as the present outputs (written in place), with the step's small inputs and outputs, made here when
        the row count changed."""
        rows, cfg, vocab = state.rows, self.config, self.config.trg_vocab_size
        if state.io.get("input_ids") is None or state.io["input_ids"].shape()[0] != rows:
            state.io = {"input_ids": self._on_device(np.zeros((rows, 1), np.int64)),
                        "cache_length": self._on_device(np.zeros((), np.int64)),
                        TOKEN_BIAS: self._on_device(state.rules.bias),
                        FORCED_TOKEN: self._on_device(state.rules.forced),
                        "logits": self._on_device(np.zeros((rows, 1, vocab), np.float32)),
                        TOP_LOGPROBS: self._on_device(np.zeros((rows, self.top_k), np.float32)),
                        TOP_IDS: self._on_device(np.zeros((rows, self.top_k), np.int64))}
        for side in state.sides:
            side.binding = binding = self.decoder.io_binding()
            for name in ("input_ids", "cache_length", TOKEN_BIAS, FORCED_TOKEN):
                binding.bind_ortvalue_input(name, state.io[name])
            binding.bind_ortvalue_input("encoder_attention_mask", state.mask)
            for name, value in zip(self.names.cross_inputs, state.cross, strict=True):
                binding.bind_ortvalue_input(name, value)
            for name in ("logits", TOP_LOGPROBS, TOP_IDS):
                binding.bind_ortvalue_output(name, state.io[name])
            for (past, present), (block, size, layer) in zip(
                    zip(self.names.self_inputs, self.names.self_outputs, strict=True), self._views(side, rows),
                    strict=True):
                shape = (rows, cfg.n_head, state.capacity, size)
                address = block.data_ptr() + layer * int(np.prod(shape)) * self.cache_dtype.itemsize
                binding.bind_input(past, self.device, 0, self.cache_dtype, shape, address)
                binding.bind_output(present, self.device, 0, self.cache_dtype, shape, address)

    def _views(self, side: Side, rows: int) -> list[tuple[ort.OrtValue, int, int]]:
        """(block, head size, layer) of each flat cache tensor in CacheNames order: per layer key then value."""
        cfg = self.config
        return [(side.blocks[kind], size, layer) for layer in range(cfg.n_layers)
                for kind, size in enumerate((cfg.d_k, cfg.d_v))]
