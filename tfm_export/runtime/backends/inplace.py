"""The in-place buffer cache: decoder_step_search over IO binding, the cache in host arrays written in place
(core.graph_spec.search_step_spec).

The contract's decoder_step returns the whole grown cache, so each step ONNX Runtime copies every layer's cache
(Concat), allocates it and the logits afresh, and Python reduces V logits per row. Here the self-attention cache
lives in NumPy buffers of fixed capacity bound to the session once (OrtValues share their memory), each bound as
both a past input and its present output, so the graph's write of the new token's keys/values lands in place;
the step's token, length and decoding rules are written into bound arrays and only K candidates per row come
back. Buffers grow in place by `capacity_step` positions when full (so growing never holds two copies of any of
it); beams that reshuffle within their input move only the rows that change. All layers' keys live in one array
and all values in another (each layer's tensor a contiguous block of it), so a beam reorder is two copies, not
one per layer and kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import onnxruntime as ort

from ...core.graph_spec import (
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
from ...core.machine import LARGE_BLOCK_BYTES
from ...core.sources import check_source_length, check_target_length
from ..counts import WorkCounts
from ..step import LOGITS_ONLY, Candidates, Reorders, StepRule
from ..step_graph import CAPACITY_STEP
from ..step_inputs import Rules, source_groups
from .decoder_step_search import DecoderStepSearchSessions

REORDER_BYTES = LARGE_BLOCK_BYTES // 4  # reorders and growth copy rows in pieces of about this size (twice at most)


@dataclass
class Buffers:
    """Everything bound to the decoder session for N rows: inputs, cache buffers and outputs."""

    binding: ort.IOBinding
    ids: np.ndarray  # (N, 1) int64, the step's token
    length: np.ndarray  # () int64, filled cache positions
    blocks: list[np.ndarray]  # per kind (keys, values) the owning (layers * N, nh, capacity, d) array
    cache: list[np.ndarray]  # per layer key, value: (N, nh, capacity, d), views into blocks
    logits: np.ndarray  # (N, 1, V)
    top: tuple[np.ndarray, np.ndarray]  # (N, K) log-probabilities and ids, best first
    values: list[ort.OrtValue]  # what is bound: the session reads and writes their memory
    total: np.ndarray = field(default_factory=lambda: np.zeros((), np.int32))  # the fused step's TOTAL_LENGTH


@dataclass
class SearchState:
    """A decode's state; steps and reorders update it in place."""

    mask: np.ndarray  # (B, S) int64, per source
    cross: tuple[np.ndarray, ...]  # per layer key (B, nh, S, dk), value (B, nh, S, dv), per source
    rules: Rules
    length: int = 0  # filled cache positions
    buffers: Buffers | None = None  # made at the first step (beam search expands the rows before it)
    group: int = 1  # rows per source: the N = B * group decoder rows are B consecutive groups

    @property
    def rows(self) -> int:
        return len(self.mask) * self.group


def layer_views(blocks: list[np.ndarray], rows: int) -> list[np.ndarray]:
    """Each flat cache tensor (CacheNames order: per layer key then value) as its layer's rows of its kind's block."""
    layers = len(blocks[0]) // rows
    return [block[layer * rows:(layer + 1) * rows] for layer in range(layers) for block in blocks]


def by_layer(block: np.ndarray, rows: int) -> np.ndarray:
    """A kind's (layers * N, ...) block as (layers, N, ...), so rows move in every layer with one index."""
    return block.reshape(len(block) // rows, rows, *block.shape[1:])


def gathered(block: np.ndarray, rows: int, taken: np.ndarray) -> np.ndarray:
    """A kind's block (`rows` rows a layer) with each layer's rows `taken`, in an array of its own: widen resizes it."""
    out = np.empty((len(block) // rows * len(taken), *block.shape[1:]), block.dtype)
    np.take(by_layer(block, rows), taken, axis=1, out=by_layer(out, len(taken)))
    return out


def move_order(rows: np.ndarray, moved: np.ndarray, per_piece: int) -> list[np.ndarray]:
    """The moved rows (row i takes row rows[i]) cut into pieces of about per_piece rows that can be copied one
    after another: a cut falls only where no row before it reads a row after it and none after reads one before.
    Copying all moved rows at once would gather them into one temporary of many megabytes, which glibc maps and
    unmaps at every step (page faults: ~10% of a beam 4 x 32 decode on the base config); small pieces reuse the heap."""
    if len(moved) <= per_piece:
        return [moved]
    at = np.arange(1, len(rows))
    reads_before = np.maximum.accumulate(rows)[:-1] < at
    reads_after = np.minimum.accumulate(rows[::-1])[::-1][1:] >= at
    ends = np.append(at[reads_before & reads_after], len(rows))  # where independent segments end
    count = np.searchsorted(moved, ends)  # moved rows before each end
    cuts = ends[np.flatnonzero(np.diff(count // per_piece, prepend=0))]
    return [piece for piece in np.split(moved, np.searchsorted(moved, cuts)) if len(piece)]


def widen(cache: np.ndarray, capacity: int, piece_bytes: int = REORDER_BYTES) -> np.ndarray:
    """A (N, H, C, D) buffer regrown to (N, H, capacity, D) in its own memory: the allocation is extended (glibc
    moves large blocks by remapping pages, not copying them), then rows are moved to their new places in pieces of
    about piece_bytes, last piece first: a piece's new place starts past the old places of the rows before it, so
    nothing is overwritten before it has moved (within a piece NumPy copies the overlapping source first, a
    temporary of piece size). Copying into a new buffer instead would hold one old layer tensor besides the grown
    cache: the decode's memory peak (29 MB on the base config at beam 4 x 32). The caller must hold no other
    reference to the buffer's memory."""
    n, h, c, d = cache.shape
    if capacity <= c:
        return cache
    cache.resize((n, h, capacity, d), refcheck=False)  # the old elements now lie flat at the start
    flat, old = cache.reshape(-1), h * c * d
    rows = max(1, piece_bytes // max(1, old * cache.itemsize))
    for end in range(n, 0, -rows):
        start = max(0, end - rows)
        grown = cache[start:end]
        grown[:, :, :c] = flat[start * old:end * old].reshape(end - start, h, c, d)
        grown[:, :, c:] = 0
    return cache


class InPlaceBackend(Reorders):
    """StepBackend (and GraphBackend) on decoder_step_search with the cache in host buffers."""

    def __init__(self, sessions: DecoderStepSearchSessions, capacity_step: int = CAPACITY_STEP) -> None:
        self.sessions, self.capacity_step = sessions, capacity_step
        self.config, self.names, self.top_k = sessions.config, sessions.names, sessions.top_k
        self.decoder, self.model_dir = sessions.decoder, sessions.model_dir
        self.counts: WorkCounts | None = None  # given by those who count work

    def run_encoder(self, src: np.ndarray) -> dict[str, np.ndarray]:
        return self.sessions.run_encoder(src)

    def encode(self, src: np.ndarray) -> SearchState:
        check_source_length(src.shape[1], self.config.n_position)
        return self.encoded(src, self.run_encoder(src))

    def encoded(self, src: np.ndarray, out: dict[str, np.ndarray]) -> SearchState:
        mask = (src != self.config.src_pad_idx).astype(np.int64)
        bias = Rules(np.zeros(self.config.trg_vocab_size, np.float32))
        return SearchState(mask, tuple(out[n] for n in self.names.cross_outputs), bias)

    def step(self, state: SearchState, tokens: np.ndarray, rule: StepRule) -> tuple[SearchState, Candidates]:
        """Candidates and logits are views of the bound outputs, valid until the next step. A rule asking for more
        candidates than the graph's K (wider beams) is served from the logits."""
        check_target_length(state.length + 1, self.config.n_position)
        buffers = state.buffers
        if buffers is None or state.length == buffers.blocks[0].shape[2]:
            buffers = self._bind(state, self._grown(state), buffers)
        buffers.ids[:, 0] = tokens
        buffers.length[...] = state.length
        buffers.total[...] = state.length + 1
        state.rules.apply(rule)
        self.decoder.run_with_iobinding(buffers.binding)
        if self.counts is not None:
            self.counts.run(state.rows)
        state.length, state.buffers = state.length + 1, buffers
        if rule.count > self.top_k:
            return state, rule.candidates(buffers.logits[:, 0])
        return state, Candidates(*buffers.top, buffers.logits[:, 0])

    def run_step(self, state: SearchState, input_ids: np.ndarray) -> tuple[SearchState, np.ndarray]:
        """(N, T) tokens, one call each (the graph takes one token per call) -> (N, T, V) logits."""
        logits = []
        for t in range(input_ids.shape[1]):
            state, found = self.step(state, input_ids[:, t], LOGITS_ONLY)
            logits.append(found.logits.copy())
        return state, np.stack(logits, axis=1)

    def permute(self, state: SearchState, rows: np.ndarray) -> SearchState:
        """Only the rows that change move, in place (most beams keep their row from step to step)."""
        rows, buffers = np.asarray(rows), state.buffers
        moved = np.flatnonzero(rows != np.arange(len(rows)))
        if buffers is None or not len(moved):
            return state
        kinds = [by_layer(block, len(rows)) for block in buffers.blocks]  # (layers, N, ...) each
        row_bytes = max(kind[:, 0, :, :state.length].nbytes for kind in kinds)
        pieces = move_order(rows, moved, max(1, REORDER_BYTES // row_bytes))
        for kind in kinds:
            for piece in pieces:  # within a piece the right side is gathered first, so overlaps are safe
                kind[:, piece, :, :state.length] = kind[:, rows[piece], :, :state.length]
        return state

    def select(self, state: SearchState, rows: np.ndarray) -> SearchState:
        """New buffers with the kept rows; the sources whose rows remain, grouped where they form equal groups."""
        rows = np.asarray(rows)
        sources, group = source_groups(rows // state.group)
        old = state.buffers
        if not np.array_equal(sources, np.arange(len(state.mask))):
            state.mask, state.cross = state.mask[sources], tuple(a[sources] for a in state.cross)
        state.group, state.buffers = group, None
        if old is not None:
            state.buffers = self._bind(state, [gathered(block, len(old.cache[0]), rows) for block in old.blocks])
        return state

    def _grown(self, state: SearchState) -> list[np.ndarray]:
        """The cache blocks with room for capacity_step more positions (zeros: the graph reads unused positions,
        so they must be finite). Existing blocks grow in place (widen), so growing never holds a second copy."""
        rows, cfg = state.rows, self.config
        capacity = min(state.length + self.capacity_step, cfg.n_position)
        if state.buffers is None:
            return [np.zeros((cfg.n_layers * rows, cfg.n_head, capacity, size), self.sessions.cache_dtype)
                    for size in (cfg.d_k, cfg.d_v)]
        # the bound OrtValues and the layer views point into the blocks: let go of them before the memory moves
        state.buffers.binding.clear_binding_inputs()
        state.buffers.binding.clear_binding_outputs()
        state.buffers.values.clear()
        state.buffers.cache.clear()
        return [widen(block, capacity) for block in state.buffers.blocks]

    def _bind(self, state: SearchState, blocks: list[np.ndarray], same_rows: Buffers | None = None) -> Buffers:
        """Bind a row set's inputs, cache and outputs once; steps only write into the bound arrays. Each cache
        buffer's OrtValue is bound as its present output too: the graph writes the new token into it in place.
        same_rows: the buffers of these very rows (a grown cache), whose other arrays are bound again rather than
        made anew (a second logits array alive at once would be the memory peak)."""
        binding, rows, cfg = self.decoder.io_binding(), state.rows, self.config
        if same_rows is None:
            buffers = Buffers(binding, np.zeros((rows, 1), np.int64), np.zeros((), np.int64), blocks,
                              layer_views(blocks, rows), np.zeros((rows, 1, cfg.trg_vocab_size), np.float32),
                              (np.zeros((rows, self.top_k), np.float32), np.zeros((rows, self.top_k), np.int64)), [])
        else:
            buffers = replace(same_rows, binding=binding, blocks=blocks, cache=layer_views(blocks, rows), values=[])
        inputs = {INPUT_IDS: buffers.ids, ENCODER_ATTENTION_MASK: state.mask, CACHE_LENGTH: buffers.length,
                  TOKEN_BIAS: state.rules.bias, FORCED_TOKEN: state.rules.forced,
                  **({TOTAL_LENGTH: buffers.total} if self.sessions.host_length else {}),
                  **dict(zip(self.names.self_inputs, buffers.cache, strict=True)),
                  **dict(zip(self.names.cross_inputs, state.cross, strict=True))}
        outputs = {LOGITS: buffers.logits, TOP_LOGPROBS: buffers.top[0], TOP_IDS: buffers.top[1]}
        bound = {}
        for names, bind in ((inputs, binding.bind_ortvalue_input), (outputs, binding.bind_ortvalue_output)):
            for name, array in names.items():
                bound[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
                bind(name, bound[name])
        for past, present in zip(self.names.self_inputs, self.names.self_outputs, strict=True):
            binding.bind_ortvalue_output(present, bound[past])
        buffers.values.extend(bound.values())
        return buffers
