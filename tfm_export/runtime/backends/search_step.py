"""What the two backends of decoder_step_search share: its sessions (encoder and step, the tied table read once),
the decoding-rule inputs it takes each step, and how decoder rows group by source. The in-place backend keeps the
cache in host arrays, the device backend in device memory; both are built from the same SearchSessions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ...artifacts.manifest import ModelDirError
from ...artifacts.model_dir import ModelDir
from ...core.config import ModelConfig
from ...core.errors import TfmExportError, first_line
from ...core.graph_spec import (
    TOTAL_LENGTH,
    Graph,
    GraphSpec,
    GraphVariant,
    cache_names,
    graph_specs,
    search_top_k,
    variant_specs,
)
from ...core.stamps import Stamps
from ...core.token_rules import TokenRules
from ..graph_cache import STAMPS, DamagedEntry, GraphCache, directory_stamps, staged_cache, uses_cache
from ..session import DEFAULT_OPTIONS, SessionOptions, runs_fused_graphs
from ..step import StepRule
from .loaders import SessionLoader, directory_options, open_graph, run_encoder, shared_values, sharing

log = logging.getLogger(__name__)
SEARCH, FUSED = GraphVariant.DECODER_STEP_SEARCH, GraphVariant.DECODER_STEP_SEARCH_FUSED


def fused_usable(model_dir: ModelDir) -> bool:
    """The directory has decoder_step_search_fused as this runtime runs it (its total length fed from the host;
    an older export's computes it on the device), and this ONNX Runtime computes it right."""
    if not model_dir.has(FUSED) or not runs_fused_graphs():
        return False
    return TOTAL_LENGTH in {t["name"] for t in model_dir.entry(FUSED)["inputs"]}


def chosen_step(model_dir: ModelDir, options: SessionOptions) -> GraphVariant:
    """decoder_step_search_fused where it is usable and the options ask for it (by default where it pays: an fp32
    directory decoded on the CPU in place); else decoder_step_search."""
    pays = model_dir.precision == "fp32" and options.device == "cpu" and options.cache != "device"
    wanted = pays if options.fused is None else options.fused
    return FUSED if wanted and fused_usable(model_dir) else SEARCH


@dataclass
class SearchSessions:
    """An encoder and a decoder_step_search (or its fused twin) session of one model directory."""

    encoder: ort.InferenceSession
    decoder: ort.InferenceSession
    config: ModelConfig
    model_dir: ModelDir | None = None
    shared: dict[str, ort.OrtValue] = field(default_factory=dict)  # memory both sessions read: lives with them

    def __post_init__(self) -> None:
        self.names, self.top_k = cache_names(self.config), search_top_k(self.config)
        # the fused step takes its total length from host memory (graph_spec.TOTAL_LENGTH)
        self.host_length = TOTAL_LENGTH in {i.name for i in self.decoder.get_inputs()}
        kind = next(i.type for i in self.decoder.get_inputs() if i.name == self.names.self_inputs[0])
        self.cache_dtype = np.dtype(np.float16 if kind == "tensor(float16)" else np.float32)

    def run_encoder(self, src: np.ndarray) -> dict[str, np.ndarray]:
        return run_encoder(self.encoder, src, self.config.src_pad_idx)


def load_search_sessions(model_dir: ModelDir, options: SessionOptions,
                         loader: SessionLoader = open_graph) -> SearchSessions:
    """The step graph chosen_step picks, with the encoder; the tied table read once and given to both. With the
    default loader on the CPU the sessions open the directory's pre-packed graphs where they match this load
    (runtime.graph_cache); ones found damaged once open are dropped, and the load made again without them."""
    stamps = directory_stamps(model_dir, options)
    cache = GraphCache(model_dir, stamps) if loader is open_graph and uses_cache(options) else None
    try:
        sessions = _load_search_sessions(model_dir, options, loader, stamps, cache)
    except DamagedEntry as exc:
        assert cache is not None
        cache.notes.append(str(exc))
        cache.used.clear()
        stamps = Stamps()  # the load made again hashes every file: its count is the one to report
        sessions = _load_search_sessions(model_dir, options, loader, stamps, None)
    if cache is not None:
        for note in cache.notes:
            log.warning("%s", note)
        if cache.used:
            log.info("%s: %s opened from its pre-packed graphs", model_dir.path, ", ".join(cache.used))
    log.info("%s: %s", model_dir.path, stamps.summary())
    return sessions


def prepack(directory: Path, options: SessionOptions = DEFAULT_OPTIONS) -> list[str]:
    """Write (or replace) the directory's pre-packed graphs (runtime.graph_cache) for a CPU load with these options,
    made by loading it as translation does (the whole directory checked first); returns the graphs it holds. The
    old ones are replaced at once, and nothing is left behind on a failure."""
    model_dir = ModelDir.read(directory)
    options = dataclasses.replace(options, device="cpu", tensorrt_ep=False)
    if not model_dir.has(chosen_step(model_dir, options)):
        raise ModelDirError(f"{directory}: has no {chosen_step(model_dir, options).filename}, the only step the "
                            "pre-packed graphs are for (int8 static directories decode with decoder_step); "
                            "nothing to pre-pack")
    stamps = dataclasses.replace(directory_stamps(model_dir, options), recording=True)  # what is stamped: kept
    with staged_cache(model_dir.path) as staging:
        _load_search_sessions(model_dir, options, open_graph, stamps, GraphCache(model_dir, stamps, build=staging))
        stamps.write(staging / STAMPS)
        return sorted(p.name for p in staging.iterdir() if p.is_dir())


def prepack_new(staging: Path, output: Path) -> None:
    """prepack for a directory being written (export, quantize, generate): one that cannot be made here (an ONNX
    Runtime that cannot save a graph, say) is a warning, not a failed export; the directory then loads without
    them."""
    try:
        prepack(staging)
    except TfmExportError as exc:
        log.warning("%s: pre-packed graphs not made (%s); it loads without them (`tfm-export prepack` retries)",
                    output, first_line(exc))


def _load_search_sessions(model_dir: ModelDir, options: SessionOptions, loader: SessionLoader, stamps: Stamps,
                          cache: GraphCache | None) -> SearchSessions:
    directory, graph = model_dir.path, chosen_step(model_dir, options)
    if not model_dir.has(graph):
        raise ModelDirError(f"{directory}: has no {graph.filename}; export the model again with `tfm-export onnx`")
    options = directory_options(model_dir, options)
    if options.memory_arena is None:
        options = dataclasses.replace(options, memory_arena=False)
    config = model_dir.config
    # one session after the other, in this thread: sessions built in two threads left their freed load-time memory
    # in a second malloc arena, ~70 MB more peak RSS on the base config, and saved no time
    with model_dir.opening(stamps.sha256) as paths, (cache.opening() if cache else contextlib.nullcontext()):
        shared = shared_values(model_dir, graph, check=False)  # the opening checks its file

        def load(name: Graph | GraphVariant, spec: GraphSpec, prepacked: bool) -> ort.InferenceSession:
            if cache is None:
                return loader(paths[name.value], spec, options, sharing(shared, prepacked))
            return cache.load(name, paths[name.value], spec, options, lambda: sharing(shared, prepacked), shared,
                              prepacked, loader)
        encoder = load(Graph.ENCODER, graph_specs(config)[Graph.ENCODER], prepacked=False)
        decoder = load(graph, variant_specs(config)[graph], prepacked=True)
    return SearchSessions(encoder, decoder, config, model_dir, shared)


@dataclass
class Rules:
    """The decoding-rule inputs of a step: the (V,) token bias and the forced token (-1: none). `changed` says
    whether the last apply() altered them, so a device copy is refreshed only then."""

    bias: np.ndarray
    forced: np.ndarray = field(default_factory=lambda: np.full((), -1, np.int64))
    banned: tuple[int, ...] | None = None  # whose ids the bias holds at -inf
    changed: bool = True

    def apply(self, rule: StepRule) -> None:
        rules: TokenRules = rule.rules
        before = (self.banned, float(self.bias[rules.eos]), int(self.forced))
        if self.banned != rules.banned:
            self.bias[:] = 0
            self.bias[list(rules.banned)] = -np.inf
            self.banned = rules.banned
        self.bias[rules.eos] = -np.inf if not rule.allow_eos or rules.eos in rules.banned else 0.0
        self.forced[...] = -1 if rule.forced is None else rule.forced
        self.changed = before != (self.banned, float(self.bias[rules.eos]), int(self.forced))


def source_groups(sources: np.ndarray) -> tuple[np.ndarray, int]:
    """Each row's source -> the sources of consecutive equal-size groups and that size; rows that do not
    form such groups get one group each (their encoder keys/values are then repeated per row)."""
    starts = np.flatnonzero(np.diff(sources, prepend=-1) != 0)
    sizes = np.diff(starts, append=len(sources))
    if len(sizes) and (sizes == sizes[0]).all():
        return sources[starts], int(sizes[0])
    return sources, 1
