"""What the two backends of decoder_step_search share: its sessions (encoder and the step graph step_graph
chooses, the tied table read once). The in-place backend keeps the cache in host arrays, the device backend in
device memory; both are built from the same DecoderStepSearchSessions (their step inputs: runtime.step_inputs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from ...artifacts.manifest import ModelDirError
from ...artifacts.model_dir import ModelDir
from ...core.config import ModelConfig
from ...core.graph_spec import (
    TOTAL_LENGTH,
    Graph,
    GraphSpec,
    all_specs,
    cache_names,
    search_top_k,
)
from ...core.stamps import Stamps
from ..prepacked_graphs import DamagedEntry, PrepackedGraphs, directory_stamps, uses_prepacked
from ..session import SessionOptions
from ..step_graph import DEFAULT_STEP, StepOptions, chosen_step
from .loaders import SessionLoader, directory_options, open_graph, run_encoder, shared_values, sharing

log = logging.getLogger(__name__)
@dataclass
class DecoderStepSearchSessions:
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


def load_decoder_step_search(model_dir: ModelDir, options: SessionOptions, loader: SessionLoader = open_graph,
                             step: StepOptions = DEFAULT_STEP, in_place: bool = True) -> DecoderStepSearchSessions:
    """The step graph chosen_step picks (in_place: for the in-place backend, else the device backend's), with the
    encoder; the tied table read once and given to both. With the default loader on the CPU the sessions open the
    directory's pre-packed graphs where they match this load (runtime.prepacked_graphs); ones found damaged once
    open are dropped, and the load made again without them."""
    stamps = directory_stamps(model_dir, options)
    store = PrepackedGraphs(model_dir, stamps) if loader is open_graph and uses_prepacked(options) else None
    try:
        sessions = load_sessions_with(model_dir, options, loader, stamps, store, step, in_place)
    except DamagedEntry as exc:
        assert store is not None
        store.notes.append(str(exc))
        store.used.clear()
        stamps = Stamps()  # the load made again hashes every file: its count is the one to report
        sessions = load_sessions_with(model_dir, options, loader, stamps, None, step, in_place)
    if store is not None:
        for note in store.notes:
            log.warning("%s", note)
        if store.used:
            log.info("%s: %s opened from its pre-packed graphs", model_dir.path, ", ".join(store.used))
    log.info("%s: %s", model_dir.path, stamps.summary())
    return sessions


def load_sessions_with(model_dir: ModelDir, options: SessionOptions, loader: SessionLoader, stamps: Stamps,
                       store: PrepackedGraphs | None, step: StepOptions = DEFAULT_STEP, in_place: bool = True
                       ) -> DecoderStepSearchSessions:
    """load_decoder_step_search with the caller's stamps and pre-packed graphs (None: none): prepacking gives one that
    builds the pre-packed graphs it is asked for."""
    directory, graph = model_dir.path, chosen_step(model_dir, options, step, in_place)
    if not model_dir.has(graph):
        raise ModelDirError(f"{directory}: has no {graph.filename}; export the model again with `tfm-export onnx`")
    options = directory_options(model_dir, options)
    if options.memory_arena is None:
        options = dataclasses.replace(options, memory_arena=False)
    config = model_dir.config
    # one session after the other, in this thread: sessions built in two threads left their freed load-time memory
    # in a second malloc arena, ~70 MB more peak RSS on the base config, and saved no time
    with model_dir.opening(stamps.sha256) as paths, (store.opening() if store else contextlib.nullcontext()):
        shared = shared_values(model_dir, graph, check=False)  # the opening checks its file

        def load(name: Graph, spec: GraphSpec, prepacked: bool) -> ort.InferenceSession:
            if store is None:
                return loader(paths[name.value], spec, options, sharing(shared, prepacked))
            return store.load(name, paths[name.value], spec, options, lambda: sharing(shared, prepacked), shared,
                              prepacked, loader)
        specs = all_specs(config)
        encoder = load(Graph.ENCODER, specs[Graph.ENCODER], prepacked=False)
        decoder = load(graph, specs[graph], prepacked=True)
    return DecoderStepSearchSessions(encoder, decoder, config, model_dir, shared)
