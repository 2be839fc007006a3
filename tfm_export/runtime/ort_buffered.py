"""ONNX Runtime on the CPU with the cache kept in place: decoder_step_buffered over IO binding.

The contract's decoder_step returns the whole grown cache, so each step ONNX Runtime copies every layer's
cache (Concat), allocates it and its logits afresh, and Python converts 4 x layers arrays in and out of
the session. Here the self-attention cache lives in NumPy buffers of fixed capacity that are bound to the
session once (OrtValues share their memory), as are the logits and the new token's keys/values; a step
writes the token and the cache length into bound arrays, runs, and copies each layer's new key/value into
its buffer. Buffers grow in place by `capacity_step` positions when full (so growing never holds two
copies of any of it); beams that reshuffle within their input move only the rows that change. All layers' keys
live in one array and all values in another (each layer's tensor a contiguous block of it), so a beam reorder
is two copies, not one per layer and kind.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..artifacts.manifest import ModelDirError
from ..artifacts.model_dir import read_manifest, shared_initializers, verified_graphs
from ..core.config import ModelConfig
from ..core.graph_spec import (
    SEQLENS_K,
    SOURCES,
    TOTAL_SEQUENCE_LENGTH,
    Graph,
    GraphVariant,
    cache_head_sizes,
    cache_names,
    graph_specs,
    variant_specs,
)
from ..core.machine import LARGE_BLOCK_BYTES
from ..core.sources import check_source_length, check_target_length
from .ort_backend import directory_options, open_graph, run_encoder
from .session import DEFAULT_OPTIONS, SessionOptions

CAPACITY_STEP = 16  # positions added when a cache buffer is full: attention reads at most this many unused
REORDER_BYTES = LARGE_BLOCK_BYTES // 4  # reorders and growth copy rows in pieces of about this size (twice at most)


def has_buffered_decoder(manifest: dict, variant: GraphVariant = GraphVariant.DECODER_STEP_BUFFERED) -> bool:
    return variant.value in manifest.get("graphs", {})


@dataclass
class Buffers:
    """Everything bound to the decoder session for N rows: inputs, cache buffers and outputs."""

    binding: ort.IOBinding
    ids: np.ndarray  # (N, 1) int64, the step's token
    length: np.ndarray  # () int64, filled cache positions
    blocks: list[np.ndarray]  # per kind (keys, values) the owning (layers * N, nh, capacity, d) array
    cache: list[np.ndarray]  # per layer key, value: (N, nh, capacity, d), views into blocks
    new: list[np.ndarray]  # per layer key, value: (N, nh, 1, d), the step's own
    logits: np.ndarray  # (N, 1, V)
    values: list[ort.OrtValue]  # what is bound: the session reads and writes their memory
    filled: np.ndarray | None = None  # decoder_step_fused: (N,) int32 seqlens_k, each row's filled positions
    total: np.ndarray | None = None  # decoder_step_fused: () int32 total_sequence_length, one more


@dataclass(frozen=True)
class BufferedState:
    mask: np.ndarray  # (B, S) int64, per source
    cross: tuple[np.ndarray, ...]  # per layer key (B, nh, S, dk), value (B, nh, S, dv), per source
    length: int  # filled cache positions
    buffers: Buffers | None = None  # made at the first step (beam search expands the rows before it)
    group: int = 1  # rows per source: the N = B * group decoder rows are B consecutive groups

    @property
    def past_length(self) -> int:
        return self.length

    @property
    def rows(self) -> int:
        return len(self.mask) * self.group


def source_groups(sources: np.ndarray) -> tuple[np.ndarray, int]:
    """Each row's source -> the sources of consecutive equal-size groups and that size; rows that do not
    form such groups get one group each (their encoder keys/values are then repeated per row)."""
    starts = np.flatnonzero(np.diff(sources, prepend=-1) != 0)
    sizes = np.diff(starts, append=len(sources))
    if len(sizes) and (sizes == sizes[0]).all():
        return sources[starts], int(sizes[0])
    return sources, 1


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


def shared_values(directory: Path, manifest: dict,
                  variant: GraphVariant = GraphVariant.DECODER_STEP_BUFFERED) -> dict[str, ort.OrtValue]:
    """The initializers a decoder variant shares with the encoder (the tied embedding table), read once."""
    arrays = shared_initializers(directory, manifest, variant.value)
    return {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in arrays.items()}


def sharing(shared: dict[str, ort.OrtValue], prepacked: bool = True) -> ort.SessionOptions:
    """Session options that use the given memory for these initializers instead of the graph's own copy.
    prepacked=False: no prepacked layout of the weights. The encoder runs once per batch: unpacked weights cost
    it 1-7 ms per batch on the base config and save ~8 MB at the int8 decode's peak (packed copies it keeps)."""
    so = ort.SessionOptions()
    for name, value in shared.items():
        so.add_initializer(name, value)
    if not prepacked:
        so.add_session_config_entry("session.disable_prepacking", "1")
    return so


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


class OrtBufferedBackend:
    """decoding.StepBackend on an encoder and a decoder_step_buffered session."""

    variant = GraphVariant.DECODER_STEP_BUFFERED

    def __init__(self, encoder: ort.InferenceSession, decoder: ort.InferenceSession, config: ModelConfig,
                 manifest: dict | None = None, capacity_step: int = CAPACITY_STEP,
                 shared: dict[str, ort.OrtValue] | None = None) -> None:
        self.encoder, self.decoder, self.config, self.manifest = encoder, decoder, config, manifest or {}
        self.capacity_step = capacity_step
        self.names = cache_names(config)
        kind = next(i.type for i in decoder.get_inputs() if i.name == self.names.self_inputs[0])
        self.cache_dtype = np.dtype(np.float16 if kind == "tensor(float16)" else np.float32)
        self.step_calls = 0  # decoder runs, for tests that count work
        # graphs exported before the encoder's keys/values came per source take them per row
        mask = next(i for i in decoder.get_inputs() if i.name == "encoder_attention_mask")
        self.per_source = mask.shape[0] == SOURCES
        self.shared = shared or {}  # memory both sessions read (shared_values): must live as long as they do

    @classmethod
    def open(cls, directory: Path, options: SessionOptions = DEFAULT_OPTIONS,
             capacity_step: int = CAPACITY_STEP) -> OrtBufferedBackend:
        manifest = read_manifest(Path(directory))
        if not has_buffered_decoder(manifest, cls.variant):
            raise ModelDirError(f"{directory}: has no {cls.variant.filename}; export the model again with "
                                "`tfm-export onnx`")
        options = directory_options(manifest, options)
        if options.memory_arena is None:
            options = replace(options, memory_arena=False)
        config = ModelConfig.from_dict(manifest["model"])
        paths = verified_graphs(Path(directory), manifest)
        shared = shared_values(Path(directory), manifest, cls.variant)
        encoder = open_graph(paths[Graph.ENCODER.value], graph_specs(config)[Graph.ENCODER], options,
                             sharing(shared, prepacked=False))
        decoder = open_graph(paths[cls.variant.value], variant_specs(config)[cls.variant], options, sharing(shared))
        return cls(encoder, decoder, config, manifest, capacity_step, shared)

    def run_encoder(self, src: np.ndarray) -> dict[str, np.ndarray]:
        return run_encoder(self.encoder, src, self.config.src_pad_idx)

    def encode(self, src: np.ndarray) -> BufferedState:
        check_source_length(src.shape[1], self.config.n_position)
        out = self.run_encoder(src)
        mask = (src != self.config.src_pad_idx).astype(np.int64)
        return BufferedState(mask, tuple(out[n] for n in self.names.cross_outputs), 0)

    def step(self, state: BufferedState, tokens: np.ndarray) -> tuple[BufferedState, np.ndarray]:
        """The returned logits are a view of the bound output buffer, valid until the next step."""
        check_target_length(state.length + 1, self.config.n_position)
        buffers = state.buffers
        if buffers is None or state.length == buffers.blocks[0].shape[2]:
            buffers = self._bind(state, self._grown(state), buffers)
        buffers.ids[:, 0] = tokens
        buffers.length[...] = state.length
        if buffers.filled is not None:  # decoder_step_fused: GroupQueryAttention's own counts
            buffers.filled[...] = state.length
            buffers.total[...] = state.length + 1
        self.decoder.run_with_iobinding(buffers.binding)
        self.step_calls += 1
        if buffers.new:  # decoder_step_buffered returns the new keys/values; decoder_step_fused wrote them itself
            for cache, new in zip(buffers.cache, buffers.new, strict=True):
                cache[:, :, state.length] = new[:, :, 0]
        return replace(state, length=state.length + 1, buffers=buffers), buffers.logits[:, 0]

    def run_step(self, state: BufferedState, input_ids: np.ndarray) -> tuple[BufferedState, np.ndarray]:
        """(N, T) tokens, one call each (the graph takes one token per call) -> (N, T, V) logits."""
        logits = []
        for t in range(input_ids.shape[1]):
            state, step_logits = self.step(state, input_ids[:, t])
            logits.append(step_logits.copy())
        return state, np.stack(logits, axis=1)

    def reorder(self, state: BufferedState, rows: np.ndarray, same_sources: bool = False) -> BufferedState:
        """Beams reshuffled within their inputs move only the rows that change, in place (most keep theirs);
        any other change of rows gathers new buffers."""
        rows = np.asarray(rows)
        buffers = state.buffers
        if same_sources and len(rows) == state.rows:
            moved = np.flatnonzero(rows != np.arange(len(rows)))
            if buffers is not None and len(moved):
                kinds = [by_layer(block, len(rows)) for block in buffers.blocks]  # (layers, N, ...) each
                row_bytes = max(kind[:, 0, :, :state.length].nbytes for kind in kinds)
                pieces = move_order(rows, moved, max(1, REORDER_BYTES // row_bytes))
                for kind in kinds:
                    for piece in pieces:  # within a piece the right side is gathered first, so overlaps are safe
                        kind[:, piece, :, :state.length] = kind[:, rows[piece], :, :state.length]
            return state
        sources, group = source_groups(rows // state.group) if self.per_source else (rows // state.group, 1)
        moved_state = BufferedState(state.mask, state.cross, state.length, group=group)
        if not np.array_equal(sources, np.arange(len(state.mask))):  # beam search's expansion keeps them as they are
            moved_state = replace(moved_state, mask=state.mask[sources], cross=tuple(a[sources] for a in state.cross))
        if buffers is None:
            return moved_state
        blocks = [gathered(block, state.rows, rows) for block in buffers.blocks]
        return replace(moved_state, buffers=self._bind(moved_state, blocks))

    def _grown(self, state: BufferedState) -> list[np.ndarray]:
        """The cache blocks with room for capacity_step more positions (zeros: the graph reads unused positions,
        so they must be finite). Existing blocks grow in place (widen), so growing never holds a second copy."""
        rows, cfg = state.rows, self.config
        capacity = min(state.length + self.capacity_step, cfg.n_position)
        if state.buffers is None:
            return [np.zeros((cfg.n_layers * rows, cfg.n_head, capacity, size), self.cache_dtype)
                    for size in (cfg.d_k, cfg.d_v)]
        # the bound OrtValues and the layer views point into the blocks: let go of them before the memory moves
        state.buffers.binding.clear_binding_inputs()
        state.buffers.binding.clear_binding_outputs()
        state.buffers.values.clear()
        state.buffers.cache.clear()
        return [widen(block, capacity) for block in state.buffers.blocks]

    def _new_buffers(self, binding: ort.IOBinding, rows: int, blocks: list[np.ndarray]) -> Buffers:
        """The arrays a row set binds besides its cache: decoder_step_buffered's return the new keys/values."""
        cfg = self.config
        return Buffers(binding, np.zeros((rows, 1), np.int64), np.zeros((), np.int64), blocks,
                       layer_views(blocks, rows),
                       [np.zeros((rows, cfg.n_head, 1, d), self.cache_dtype) for d in cache_head_sizes(cfg)],
                       np.zeros((rows, 1, cfg.trg_vocab_size), np.float32), [])

    def _bind(self, state: BufferedState, blocks: list[np.ndarray], same_rows: Buffers | None = None) -> Buffers:
        """Bind a row set's inputs, cache and outputs once; steps only write into the bound arrays.
        same_rows: the buffers of these very rows (a grown cache), whose other arrays are bound again rather than
        made anew (a second logits array alive at once would be the memory peak). Where the buffers carry
        GroupQueryAttention's counts (decoder_step_fused), each cache buffer's OrtValue is bound as its present
        output too: the graph extends the buffers in place."""
        binding = self.decoder.io_binding()
        if same_rows is None:
            buffers = self._new_buffers(binding, state.rows, blocks)
        else:
            buffers = replace(same_rows, binding=binding, blocks=blocks, cache=layer_views(blocks, state.rows),
                              values=[])
        cache = buffers.cache
        counts = {} if buffers.filled is None else {SEQLENS_K: buffers.filled,
                                                     TOTAL_SEQUENCE_LENGTH: buffers.total}
        inputs = {"input_ids": buffers.ids, "encoder_attention_mask": state.mask, "cache_length": buffers.length,
                  **counts, **dict(zip(self.names.self_inputs, cache, strict=True)),
                  **dict(zip(self.names.cross_inputs, state.cross, strict=True))}
        outputs = {"logits": buffers.logits}
        if buffers.new:  # decoder_step_buffered returns the new token's keys/values
            outputs |= dict(zip(self.names.new_outputs, buffers.new, strict=True))
        bound = {}
        for names, bind in ((inputs, binding.bind_ortvalue_input), (outputs, binding.bind_ortvalue_output)):
            for name, array in names.items():
                bound[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
                bind(name, bound[name])
        if counts:
            for past, present in zip(self.names.self_inputs, self.names.self_outputs, strict=True):
                binding.bind_ortvalue_output(present, bound[past])
        buffers.values.extend(bound.values())
        return buffers
