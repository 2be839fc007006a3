"""How a backend's graphs become sessions, apart from the backends that run them (as Polygraphy keeps loaders apart
from runners): the default loader opens an ONNX Runtime session held to the graph contract; the Triton bls layout
and int8 calibration pass loaders of their own (a native Triton model, a session that records its feeds), and the
same backend code runs over them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ...artifacts.manifest import ModelDirError
from ...artifacts.model_dir import ModelDir
from ...core.graph_spec import ATTENTION_MASK, CONTRACT_GRAPHS, INPUT_IDS, Graph, GraphSpec, contract_specs
from ..prepacked_graphs import directory_stamps
from ..session import SessionOptions, open_session, run

# (graph file, its contract, options, ONNX Runtime options to start from) -> something with a session's
# get_inputs / get_outputs / run
SessionLoader = Callable[[Path, GraphSpec, SessionOptions, ort.SessionOptions | None], Any]


def check_contract_tensors(session: ort.InferenceSession, spec: GraphSpec, path: Path) -> ort.InferenceSession:
    """A graph whose inputs/outputs (names, ranks, fixed sizes) are not the ones the manifest's model config
    implies (a graph of another model put in the directory, an edited config) is refused here, not met as a
    KeyError or an ONNX Runtime shape error mid-decode."""
    for kind, got, want in (("inputs", session.get_inputs(), spec.inputs), ("outputs", session.get_outputs(),
                                                                             spec.outputs)):
        names, expected = [v.name for v in got], [t.name for t in want]
        ranks, expected_ranks = [len(v.shape) for v in got], [len(t.shape) for t in want]
        if names != expected or ranks != expected_ranks:
            raise ModelDirError(f"{path}: its {kind} do not match the graph contract for this manifest's model "
                                f"(got {len(names)}, expected {len(expected)}: {_first_difference(names, expected)}); "
                                "export the model again")
        for value, tensor in zip(got, want, strict=True):  # fixed sizes (heads, head size) as the config says
            sizes = [(g, w) for g, w in zip(value.shape, tensor.shape, strict=True)
                     if isinstance(g, int) and isinstance(w, int) and g != w]
            if sizes:
                raise ModelDirError(f"{path}: {kind[:-1]} {value.name!r} has size {sizes[0][0]} where this manifest's "
                                    f"model config implies {sizes[0][1]} (shape {list(tensor.shape)}); the manifest "
                                    "does not describe this graph: export the model again")
    return session


def _first_difference(got: list[str], want: list[str]) -> str:
    for a, b in zip(got, want, strict=False):
        if a != b:
            return f"{a!r} where {b!r} belongs"
    return "a different count" if len(got) != len(want) else "a different rank"


def open_graph(path: Path, spec: GraphSpec, options: SessionOptions,
               session_options: ort.SessionOptions | None = None) -> ort.InferenceSession:
    """The default loader: a session for a graph file already checked against its manifest, held to the contract.
    A capturable graph's session may capture CUDA graphs (the device backend replays them)."""
    return check_contract_tensors(open_session(path, options, session_options, spec.capturable), spec, path)


def directory_options(model_dir: ModelDir, options: SessionOptions) -> SessionOptions:
    """The session options a directory's graphs run with. int8 static (Q/DQ) graphs on the CPU run with their Q/DQ
    as float ops: ONNX Runtime's x86 kernels have no fast path for symmetric int8 with per-channel weights, so it
    would dequantize every weight on every call (~10x slower than fp32 on the base config); folded, the weights are
    dequantized once at load and the numbers are the same Q/DQ model's. For int8 speed on CPU, quantize --mode
    dynamic."""
    if model_dir.int8_mode == "static" and not options.on_gpu:
        return dataclasses.replace(options, fold_qdq=True)
    return options


def open_contract_sessions(model_dir: ModelDir, options: SessionOptions, loader: SessionLoader = open_graph
                           ) -> tuple[dict[Graph, Any], dict[str, ort.OrtValue]]:
    """The contract's two graphs as sessions (by `loader`), the tied table mapped once for both, and the shared
    values they were given: the concat backend's sessions, and what verify compares graph by graph."""
    options, specs = directory_options(model_dir, options), contract_specs(model_dir.config)
    with model_dir.opening(directory_stamps(model_dir, options).sha256) as paths:
        shared = shared_values(model_dir, Graph.DECODER_STEP, check=False)  # the opening checks its file
        return {g: loader(paths[g.value], specs[g], options, sharing(shared)) for g in CONTRACT_GRAPHS}, shared


def run_encoder(encoder: Any, src: np.ndarray, pad: int) -> dict[str, np.ndarray]:
    """The encoder graph's outputs for (B, S) right-padded source ids."""
    return run(encoder, {INPUT_IDS: src.astype(np.int64), ATTENTION_MASK: (src != pad).astype(np.int64)})


def shared_values(model_dir: ModelDir, graph: str, check: bool = True) -> dict[str, ort.OrtValue]:
    """The initializers a decoder variant shares with the encoder (the tied embedding table), read once."""
    arrays = model_dir.shared_initializers(graph, check)
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
