"""The device-resident cache, shaped for CUDA graphs: decoder_step_search with every buffer on the device (a GPU
through the CUDA execution provider), without PyTorch, and the same shapes and addresses step after step.

A captured CUDA graph replays only with the shapes and memory it was captured with. So a decode's memory is a
Workspace made for one Shape (sources, rows per source, padded source length, cache capacity), kept in a pool and
reused by every later batch of that shape: the encoder writes into its buffers, a step writes its token, length
and decoding rules into small device arrays in place (the vocabulary-sized bias only when the rules change), and
the decoder's run over one of the workspace's two cache sets can be captured once and replayed. Rows that finish
stay where they are (their steps are wasted, their outputs ignored): the search's rows are a view (`live`) of the
workspace's physical rows, and a beam reorder gathers the current set's rows into the other set on the device.
Only when half the sources have finished, or the cache is full, does the decode move to a smaller or a larger
workspace (each shape a graph of its own). With device "cpu" the same code runs on host memory, uncaptured, which
is how it is tested on machines without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from ...core.graph_spec import (
    ATTENTION_MASK,
    CACHE_LENGTH,
    ENCODER_ATTENTION_MASK,
    FORCED_TOKEN,
    INPUT_IDS,
    LOGITS,
    TOKEN_BIAS,
    TOP_IDS,
    TOP_LOGPROBS,
    TOTAL_LENGTH,
)
from ...core.sources import check_source_length, check_target_length
from ..counts import WorkCounts
from ..session import CUDA_PROVIDER
from ..step import LOGITS_ONLY, Candidates, Reorders, StepRule
from ..step_graph import CAPACITY_STEP
from ..step_inputs import Rules, source_groups
from .decoder_step_search import DecoderStepSearchSessions
from .pingpong import DeviceMemory, PingPong

SOURCE_BUCKET = 16  # source lengths are padded up to a multiple of this, so batches of similar lengths share a shape
MAX_POOLED = 8  # workspaces (and source buffers) kept for reuse; beyond, the least recently used is let go
MAX_CAPTURED = 32  # workspaces whose steps are captured as CUDA graphs (ONNX Runtime keeps each); later ones run plain
SMALL_INPUTS = (INPUT_IDS, CACHE_LENGTH, TOKEN_BIAS, FORCED_TOKEN)
OUTPUTS = (LOGITS, TOP_LOGPROBS, TOP_IDS)


@dataclass(frozen=True)
class Shape:
    """What a workspace is made for: a captured step replays only on these."""

    sources: int
    group: int  # rows per source, consecutive
    source_length: int  # padded
    capacity: int  # cache positions

    @property
    def rows(self) -> int:
        return self.sources * self.group


@dataclass(eq=False)
class Sources:
    """The encoder's outputs for `sources` sources padded to one length, in fixed device buffers."""

    mask: ort.OrtValue  # (B, S) int64
    cross: tuple[ort.OrtValue, ...]  # per layer key, value (B, nh, S, d)


@dataclass(eq=False)
class Workspace:
    """Everything one Shape's steps read and write, bound once: the sources, the cache (two sets), the step's small
    inputs and outputs, and per cache set the decoder's binding and its CUDA graph id (-1: not captured)."""

    shape: Shape
    sources: Sources
    cache: PingPong
    io: dict[str, ort.OrtValue]
    ids: np.ndarray  # (rows, 1) the host's copy of the step's tokens: finished rows keep theirs
    steps: list[ort.IOBinding] = field(default_factory=list)
    runs: list[ort.RunOptions] = field(default_factory=list)


@dataclass
class GraphState:
    """A decode's state: its sources, the workspace once stepping (beam search groups rows before the first step),
    and which physical row each of the search's rows is."""

    sources: Sources
    shape: Shape  # of the next step: sources, group and padded source length; capacity once stepping
    rules: Rules
    live: np.ndarray  # the workspace row of each search row
    work: Workspace | None = None
    length: int = 0
    rules_in: Workspace | None = None  # the workspace whose rule inputs hold `rules`

    @property
    def rows(self) -> int:
        return len(self.live)


def pooled(pool: dict, key: tuple, make, avoid: object = None) -> object:
    """pool[key]'s entry other than `avoid` (two may exist per key, so that a gather never writes what it reads),
    made if needed; the pool keeps its MAX_POOLED most recently used entries."""
    kept = pool.pop(key, [])
    pool[key] = kept  # now the most recently used
    found = next((entry for entry in kept if entry is not avoid), None)
    if found is None:
        found = make()
        kept.append(found)
        while sum(map(len, pool.values())) > MAX_POOLED:
            oldest = next(k for k in pool if k != key)
            pool[oldest].pop(0)
            if not pool[oldest]:
                del pool[oldest]
    return found


def padded_length(length: int, limit: int) -> int:
    return min(-(-length // SOURCE_BUCKET) * SOURCE_BUCKET, limit)


class DeviceBackend(Reorders):
    """StepBackend (and GraphBackend) on decoder_step_search whose memory is all on the sessions' device, in
    workspaces of fixed shapes; one decode at a time."""

    def __init__(self, sessions: DecoderStepSearchSessions, capacity_step: int = CAPACITY_STEP,
                 cuda_graphs: bool = False) -> None:
        """capacity_step: the first capacity of a cache (it doubles when full). cuda_graphs: capture each shape's
        steps (the decoder session must have been made with the CUDA provider's enable_cuda_graph)."""
        self.sessions, self.capacity_step = sessions, capacity_step
        self.config, self.names, self.top_k = sessions.config, sessions.names, sessions.top_k
        self.decoder, self.model_dir = sessions.decoder, sessions.model_dir
        providers = self.decoder.get_providers()
        self.device = "cuda" if CUDA_PROVIDER in providers else "cpu"
        # a captured graph would freeze the fused step's host-side total length: that step runs uncaptured
        self.cuda_graphs = cuda_graphs and self.device == "cuda" and not sessions.host_length
        self.memory = DeviceMemory(self.device, providers, sessions.cache_dtype)
        self._sources: dict = {}  # (count, length) -> Sources; pooled()
        self._workspaces: dict = {}  # (shape, sources) -> Workspace; pooled()
        self.captured = 0  # shapes whose steps have a CUDA graph id
        self.counts: WorkCounts | None = None  # given by those who count work (finished rows: fixed shapes' price)

    # --- sources -----------------------------------------------------------------------------------------------

    def run_encoder(self, src: np.ndarray) -> dict[str, np.ndarray]:
        return self.sessions.run_encoder(src)

    def encode(self, src: np.ndarray) -> GraphState:
        check_source_length(src.shape[1], self.config.n_position)
        padded, mask, sources = self._padded(src)
        binding = self.sessions.encoder.io_binding()
        binding.bind_cpu_input(INPUT_IDS, padded)
        binding.bind_cpu_input(ATTENTION_MASK, mask)
        for name, value in zip(self.names.cross_outputs, sources.cross, strict=True):
            binding.bind_output(name, self.device, 0, self.memory.element, value.shape(), value.data_ptr())
        self.sessions.encoder.run_with_iobinding(binding)
        return self._state(src, sources)

    def encoded(self, src: np.ndarray, out: dict[str, np.ndarray]) -> GraphState:
        """The encoder's outputs for `src` uploaded into the padded source buffers (the padding's positions zero:
        masked, as the encoder's own are)."""
        _, _, sources = self._padded(src)
        for name, value in zip(self.names.cross_outputs, sources.cross, strict=True):
            padded = np.zeros(value.shape(), out[name].dtype)
            padded[:, :, :src.shape[1]] = out[name]
            value.update_inplace(padded)
        return self._state(src, sources)

    def _padded(self, src: np.ndarray) -> tuple[np.ndarray, np.ndarray, Sources]:
        """The ids padded to their bucket's length, their mask (uploaded) and the buffers for the encoder's outputs."""
        cfg = self.config
        padded = np.full((len(src), padded_length(src.shape[1], cfg.n_position)), cfg.src_pad_idx, np.int64)
        padded[:, :src.shape[1]] = src
        sources = self._sources_for(*padded.shape)
        mask = (padded != cfg.src_pad_idx).astype(np.int64)
        sources.mask.update_inplace(mask)
        return padded, mask, sources

    def _state(self, src: np.ndarray, sources: Sources) -> GraphState:
        shape = Shape(len(src), 1, sources.mask.shape()[1], 0)
        return GraphState(sources, shape, Rules(np.zeros(self.config.trg_vocab_size, np.float32)), np.arange(len(src)))

    def _sources_for(self, count: int, length: int, avoid: Sources | None = None) -> Sources:
        """Fixed buffers for `count` sources of `length` positions (made once, reused), other than `avoid`."""
        def make() -> Sources:
            cfg = self.config
            cross = tuple(self.memory.zeros((count, cfg.n_head, length, size))
                          for size in (cfg.d_k, cfg.d_v) * cfg.n_layers)
            return Sources(self.memory.upload(np.zeros((count, length), np.int64)), cross)
        return pooled(self._sources, (count, length), make, avoid)

    # --- steps ---------------------------------------------------------------------------------------------------

    def step(self, state: GraphState, tokens: np.ndarray, rule: StepRule) -> tuple[GraphState, Candidates]:
        check_target_length(state.length + 1, self.config.n_position)
        if state.work is None or state.length == state.shape.capacity:
            self._grow(state)
        work = state.work
        work.ids[state.live, 0] = tokens
        work.io[INPUT_IDS].update_inplace(work.ids)
        work.io[CACHE_LENGTH].update_inplace(np.array(state.length, np.int64))
        if self.sessions.host_length:
            work.io[TOTAL_LENGTH].update_inplace(np.array(state.length + 1, np.int32))
        state.rules.apply(rule)
        if state.rules.changed or state.rules_in is not work:  # a vocabulary-sized upload: only when needed
            work.io[TOKEN_BIAS].update_inplace(state.rules.bias)
            work.io[FORCED_TOKEN].update_inplace(state.rules.forced)
            state.rules_in = work
            if self.counts is not None:
                self.counts.rule_uploads += 1
        current = work.cache.current
        self.decoder.run_with_iobinding(work.steps[current], work.runs[current])
        if self.counts is not None:
            self.counts.run(work.shape.rows, work.shape.rows - state.rows)
        state.length += 1
        if rule.count > self.top_k:
            return state, rule.candidates(work.io[LOGITS].numpy()[state.live, 0])
        return state, Candidates(work.io[TOP_LOGPROBS].numpy()[state.live], work.io[TOP_IDS].numpy()[state.live])

    def run_step(self, state: GraphState, input_ids: np.ndarray) -> tuple[GraphState, np.ndarray]:
        """(N, T) tokens, one call each -> (N, T, V) logits, copied to the host."""
        logits = []
        for t in range(input_ids.shape[1]):
            state, _ = self.step(state, input_ids[:, t], LOGITS_ONLY)
            logits.append(state.work.io[LOGITS].numpy()[state.live, 0])
        return state, np.stack(logits, axis=1)

    # --- reorders ------------------------------------------------------------------------------------------------

    def permute(self, state: GraphState, rows: np.ndarray) -> GraphState:
        return self.select(state, rows)

    def select(self, state: GraphState, rows: np.ndarray) -> GraphState:
        """Row i takes row rows[i]. Within the workspace where it can: each search row takes the next slot of its
        source's group, gathered from its parent's row where they differ; finished sources' rows stay as they were.
        A new shape where it must: before the first step (beam search groups the rows), a wider group, or half the
        sources finished (each search row then gets a workspace row again)."""
        parents = state.live[np.asarray(rows)]  # workspace rows
        group = state.shape.group
        source = parents // group
        starts = np.flatnonzero(np.diff(source, prepend=-1))
        rank = np.arange(len(parents)) - np.repeat(starts, np.diff(np.append(starts, len(parents))))
        fits = rank.max(initial=0) < group and len(np.unique(source)) == len(starts)
        if state.work is None or not fits or 2 * len(starts) <= state.shape.sources:
            return self._regroup(state, parents)
        target = source * group + rank
        moves = np.arange(state.shape.rows)
        moves[target] = parents
        if (moves != np.arange(len(moves))).any():
            state.work.cache.gather(moves, state.shape.capacity)
        state.live = target
        return state

    def _regroup(self, state: GraphState, parents: np.ndarray) -> GraphState:
        """The rows `parents` (workspace rows) as consecutive groups of a new shape: their sources gathered into
        buffers of their own and, once stepping, their cache into a workspace of that shape."""
        sources, size = source_groups(parents // state.shape.group)
        if not np.array_equal(sources, np.arange(state.shape.sources)):
            new = self._sources_for(len(sources), state.shape.source_length, avoid=state.sources)
            self.memory.gather_sources(state.sources.cross, state.sources.mask, sources, (*new.cross, new.mask))
            state.sources = new
        state.shape = Shape(len(sources), size, state.shape.source_length, state.shape.capacity)
        if state.work is not None:
            work = self._workspace(state.shape, state.sources, avoid=state.work)
            state.work.cache.gather(parents, state.shape.capacity, into=work.cache)
            state.work = work
        state.live = np.arange(len(parents))
        return state

    def _grow(self, state: GraphState) -> None:
        """The first workspace, or one of twice the capacity (at most the model's positions), the cache copied."""
        capacity = self.capacity_step if state.work is None else state.shape.capacity * 2
        state.shape = Shape(state.shape.sources, state.shape.group, state.shape.source_length,
                            min(capacity, self.config.n_position))
        old, state.work = state.work, self._workspace(state.shape, state.sources)
        if old is not None:
            old.cache.grow_into(state.work.cache, old.shape.capacity)

    # --- workspaces ----------------------------------------------------------------------------------------------

    def _workspace(self, shape: Shape, sources: Sources, avoid: Workspace | None = None) -> Workspace:
        """The pool's workspace of this shape over these sources (made and bound once), other than `avoid`; its
        steps captured, where CUDA graphs are on, for the first MAX_CAPTURED workspaces."""
        return pooled(self._workspaces, (shape, id(sources)), lambda: self._made(shape, sources), avoid)

    def _made(self, shape: Shape, sources: Sources) -> Workspace:
        cfg, rows = self.config, shape.rows
        cache = PingPong.allocate(self.memory, rows, cfg.n_layers, cfg.n_head, (cfg.d_k, cfg.d_v), shape.capacity)
        io = {INPUT_IDS: self.memory.upload(np.zeros((rows, 1), np.int64)),
              CACHE_LENGTH: self.memory.upload(np.zeros((), np.int64)),
              TOKEN_BIAS: self.memory.upload(np.zeros(cfg.trg_vocab_size, np.float32)),
              FORCED_TOKEN: self.memory.upload(np.full((), -1, np.int64)),
              LOGITS: self.memory.upload(np.zeros((rows, 1, cfg.trg_vocab_size), np.float32)),
              TOP_LOGPROBS: self.memory.upload(np.zeros((rows, self.top_k), np.float32)),
              TOP_IDS: self.memory.upload(np.zeros((rows, self.top_k), np.int64))}
        if self.sessions.host_length:  # in host memory, where GroupQueryAttention's CUDA kernel reads it
            io[TOTAL_LENGTH] = ort.OrtValue.ortvalue_from_numpy(np.zeros((), np.int32))
        work = Workspace(shape, sources, cache, io, np.full((rows, 1), cfg.trg_pad_idx, np.int64))
        for side in range(2):
            work.steps.append(self._bound(work, side))
            work.runs.append(self._run_options())
        return work

    def _run_options(self) -> ort.RunOptions:
        options = ort.RunOptions()
        if self.cuda_graphs and self.captured < MAX_CAPTURED:
            self.captured += 1
            options.add_run_config_entry("gpu_graph_id", str(self.captured))
        else:
            options.add_run_config_entry("gpu_graph_id", "-1")
        return options

    def _bound(self, work: Workspace, side: int) -> ort.IOBinding:
        """The decoder bound to one cache set: each layer's tensors as its past inputs and, written in place, its
        present outputs; the sources, small inputs and outputs of the workspace."""
        binding = self.decoder.io_binding()
        for name in (*SMALL_INPUTS, *([TOTAL_LENGTH] if self.sessions.host_length else [])):
            binding.bind_ortvalue_input(name, work.io[name])
        binding.bind_ortvalue_input(ENCODER_ATTENTION_MASK, work.sources.mask)
        for name, value in zip(self.names.cross_inputs, work.sources.cross, strict=True):
            binding.bind_ortvalue_input(name, value)
        for name in OUTPUTS:
            binding.bind_ortvalue_output(name, work.io[name])
        for past, present, (address, shape) in zip(self.names.self_inputs, self.names.self_outputs,
                                                   work.cache.tensors(side, work.shape.capacity), strict=True):
            binding.bind_input(past, self.device, 0, self.memory.element, shape, address)
            binding.bind_output(present, self.device, 0, self.memory.element, shape, address)
        return binding
