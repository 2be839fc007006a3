"""Run a model directory's graphs on generated inputs: ONNX Runtime anywhere, and, through Polygraphy,
TensorRT against ONNX Runtime where TensorRT and a GPU are present.

The inputs come from the graph specs at the shapes an engine must take: one row and one source
token, a padded batch, the first decoder step (past length 0), a later step, and the longest
source and past the model allows. ONNX Runtime's outputs are held to the contract (shape per axis
symbol, dtype, finite); TensorRT's are compared with ONNX Runtime's on the same graph and inputs,
with tolerances per precision, by Polygraphy's comparator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..artifacts.model_dir import ModelDir
from ..core.config import ModelConfig
from ..core.errors import TfmExportError, first_line
from ..core.graph_spec import (
    ATTENTION_MASK,
    BATCH,
    CACHE_LENGTH,
    CAPACITY,
    ENCODER_ATTENTION_MASK,
    FORCED_TOKEN,
    INPUT_IDS,
    NEW_LEN,
    PAST_LEN,
    SOURCES,
    SRC_LEN,
    TOKEN_BIAS,
    TOTAL_LEN,
    Graph,
    GraphSpec,
    tensorrt_specs,
)
from ..core.tokenizer import FIRST_TOKEN_ID
from ..graphs.onnx_io import load_graph
from ..runtime.session import open_session, run

# TensorRT against ONNX Runtime on the same graph (Polygraphy elementwise: an element fails only beyond both).
TRT_TOLERANCES = {"fp32": (1e-3, 1e-3), "fp16": (2e-2, 2e-2), "int8": (1e-1, 1e-1)}  # (atol, rtol)


@dataclass(frozen=True)
class Case:
    rows: int
    source: int
    past: int

    def sizes(self) -> dict[str, int]:
        return {BATCH: self.rows, SOURCES: self.rows, SRC_LEN: self.source, NEW_LEN: 1, PAST_LEN: self.past,
                TOTAL_LEN: self.past + 1, CAPACITY: self.past + 1}  # CAPACITY: room for this step's token

    def label(self, graph: Graph) -> str:
        past = f", past {self.past}" if graph is not Graph.ENCODER else ""
        return f"rows {self.rows}, source {self.source}{past}"


@dataclass(frozen=True)
class CheckResult:
    graph: str
    runner: str
    case: str
    problem: str | None  # None: passed


def cases(config: ModelConfig, max_rows: int = 4) -> list[Case]:
    """The shapes that break engines first: tiny, padded, past 0, and the model's limits."""
    longest = config.n_position
    return [Case(1, 1, 0), Case(3, 7, 0), Case(2, 5, 4), Case(max_rows, longest, longest - 1)]


def feeds(spec: GraphSpec, case: Case, types: dict[str, np.dtype], vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Generated inputs for one graph: token ids from the vocabulary, source masks with the last row
    padded to half its length, cache tensors ~N(0, 1) in the graph's own float type."""
    rng, sizes = np.random.default_rng(seed), case.sizes()
    out = {}
    for tensor in spec.inputs:
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in tensor.shape)
        if tensor.name == INPUT_IDS:
            out[tensor.name] = rng.integers(FIRST_TOKEN_ID, vocab, shape, dtype=np.int64)
        elif tensor.name == CACHE_LENGTH:
            out[tensor.name] = np.array(case.past, dtype=np.int64)
        elif tensor.name == TOKEN_BIAS:  # decoder_step_search's rules: none banned, nothing forced
            out[tensor.name] = np.zeros(shape, types[tensor.name])
        elif tensor.name == FORCED_TOKEN:
            out[tensor.name] = np.array(-1, dtype=np.int64)
        elif tensor.name in (ATTENTION_MASK, ENCODER_ATTENTION_MASK):
            mask = np.ones(shape, dtype=np.int64)
            if shape[0] > 1:
                mask[-1, max(1, shape[1] // 2):] = 0
            out[tensor.name] = mask
        else:
            out[tensor.name] = rng.standard_normal(shape).astype(types[tensor.name])
    return out


def _input_types(directory: ModelDir, graph: Graph) -> dict[str, np.dtype]:
    model = load_graph(directory, graph.value, external_data=False)
    return {v.name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
            for v in model.graph.input}


def _contract_problem(spec: GraphSpec, case: Case, outputs: dict[str, np.ndarray]) -> str | None:
    sizes = case.sizes()
    for tensor in spec.outputs:
        if tensor.name not in outputs:
            return f"output {tensor.name} missing"
        got, want = outputs[tensor.name], tuple(sizes[d] if isinstance(d, str) else d for d in tensor.shape)
        if got.shape != want:
            return f"{tensor.name} has shape {got.shape}, the contract says {want}"
        if got.dtype.kind == "f" and not np.isfinite(got).all():
            return f"{tensor.name} has non-finite values"
    return None


def _onnxruntime_outputs(path: Path, data: list[dict[str, np.ndarray]]) -> list[tuple[str, list[dict]]]:
    """Every case through ONNX Runtime as the runtime opens graphs. (Polygraphy's ONNX-Runtime runner imports
    PyTorch wherever it is installed, to check whether its inputs are torch tensors; checking needs none.)"""
    session = open_session(path)
    return [("onnxruntime", [run(session, feed) for feed in data])]


def _polygraphy_run(runners: list[Any], data: list[dict[str, np.ndarray]]):
    from polygraphy.comparator import Comparator
    from polygraphy.logger import G_LOGGER
    G_LOGGER.module_severity = G_LOGGER.ERROR
    try:
        return Comparator.run(runners, data_loader=data)
    except Exception as exc:  # Polygraphy raises PolygraphyException after logging the runtime's error
        raise TfmExportError(f"Polygraphy run failed: {first_line(exc)}") from None


def check_onnxruntime(model_dir: Path, trt: bool = False) -> list[CheckResult]:
    """Every graph on every case through ONNX Runtime; with trt, through Polygraphy's TensorRT and ONNX-Runtime
    runners, compared."""
    directory = ModelDir.read(model_dir)
    config = directory.config
    results = []
    for graph, spec in tensorrt_specs(config, directory.graphs).items():
        path = directory.graph_path(graph)
        types = _input_types(directory, graph)
        vocab = config.src_vocab_size if graph is Graph.ENCODER else config.trg_vocab_size
        case_list = cases(config)
        data = [feeds(spec, c, types, vocab, seed=i) for i, c in enumerate(case_list)]
        run_results = _polygraphy_run([_ort_runner(path), _trt_runner(path, spec, config)], data) if trt \
            else _onnxruntime_outputs(path, data)
        for runner_name, outputs in run_results:
            for case, out in zip(case_list, outputs, strict=True):
                problem = _contract_problem(spec, case, {k: np.asarray(v) for k, v in out.items()})
                results.append(CheckResult(graph.value, runner_name, case.label(graph), problem))
        if trt:
            results += _compare(graph, run_results, case_list, directory.precision)
    return results


def _ort_runner(path: Path):
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    return OnnxrtRunner(SessionFromOnnx(str(path), providers=["cpu"]), name="onnxruntime")


def _trt_runner(path: Path, spec: GraphSpec, config: ModelConfig):
    """Polygraphy's TensorRT runner on the graph as `tfm-export trt` builds it (strongly typed, one profile)."""
    from polygraphy.backend.trt import CreateConfig, EngineFromNetwork, NetworkFromOnnxPath, Profile, TrtRunner

    from ..runtime.tensorrt_platform import current_platform
    from .profiles import ShapeLimits, profile_shapes
    current_platform()  # one line if TensorRT or the GPU is missing
    profile = Profile()
    limits = ShapeLimits(max_batch=4).resolved(config.n_position)
    for name, (low, opt, high) in profile_shapes(spec, limits).items():
        profile.add(name, low, opt, high)
    engine = EngineFromNetwork(NetworkFromOnnxPath(str(path), strongly_typed=True),
                               CreateConfig(tf32=False, profiles=[profile]))
    return TrtRunner(engine, name="tensorrt")


def _compare(graph: Graph, run_results, case_list: list[Case], precision: str) -> list[CheckResult]:
    from polygraphy.comparator import Comparator, CompareFunc
    atol, rtol = TRT_TOLERANCES[precision]
    accuracy = Comparator.compare_accuracy(run_results, compare_func=CompareFunc.simple(atol=atol, rtol=rtol))
    if not hasattr(accuracy, "items"):  # Polygraphy 0.53+: one AccuracyResult per comparison function
        accuracy = accuracy[0]
    out = []
    for pair, iterations in accuracy.items():
        for case, outputs in zip(case_list, iterations, strict=True):
            failed = [name for name, result in outputs.items() if not bool(result)]
            problem = f"{', '.join(failed[:3])} differ beyond atol {atol}, rtol {rtol}" if failed else None
            out.append(CheckResult(graph.value, " vs ".join(pair), case.label(graph), problem))
    return out
