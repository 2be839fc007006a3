"""What a repository is written with and what its models exchange, described once for the command, the config
writer (outside the server) and the Python-backend model (inside it). It imports no tritonclient, so the CLI
(for every command) and the server-side model (with the runtime-only install) can import it.

The text models take `TEXT` and answer `TRANSLATION`, `SCORE`, `N_BEST`, `N_BEST_SCORES` and `N_BEST_COUNT`.
The native encoder/decoder_step models take what the graphs take: names and dtypes from a model directory's
manifest (what the exported graphs declare), or, for TensorRT engines, the graph contract with the dtypes the
engines were built with. Dims leave out the batch axis (Triton adds it) and write every dynamic axis as -1.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..artifacts.engine_dir import TENSORRT, EngineDir
from ..artifacts.model_dir import ModelDir
from ..core.graph_spec import CONTRACT_GRAPHS, LOGITS, Graph, contract_specs

LAYOUTS = ("translator", "bls")
DEVICES = ("cpu", "gpu")
DEFAULT_NAME = "translator"
DEFAULT_MAX_BATCH = 64  # rows (sentences x beams) per execution, as for `tfm-export trt`
# `tfm-export serve`: where it listens by default (tritonserver's own ports: HTTP, gRPC, metrics), and the serving
# environment that `make serving-env` builds beside the checkout's .venv (its own, as pytriton pins numpy<2)
SERVE_HOST, SERVE_PORTS = "127.0.0.1", (8000, 8001, 8002)
SERVING_VENV = ".venv-serving"

TEXT = "TEXT"  # (batch, 1) BYTES: one UTF-8 sentence per row
TRANSLATION, SCORE = "TRANSLATION", "SCORE"  # (batch, 1) BYTES, FP32: the best hypothesis and its summed log-prob
# (batch, n_best) BYTES, FP32: best first, each scored by what ranks them (log-prob / length ** length_penalty);
# where the beams finished fewer hypotheses than n_best, the last entries are "" with score -inf
N_BEST, N_BEST_SCORES = "N_BEST", "N_BEST_SCORES"
N_BEST_COUNT = "N_BEST_COUNT"  # (batch, 1) INT32: how many of the n_best entries are hypotheses


@dataclass(frozen=True)
class TritonTensor:
    name: str
    dtype: str  # "bytes" or a NumPy dtype name
    dims: tuple[int, ...]


TEXT_INPUTS = (TritonTensor(TEXT, "bytes", (1,)),)
TEXT_OUTPUTS = (TritonTensor(TRANSLATION, "bytes", (1,)), TritonTensor(SCORE, "float32", (1,)),
                TritonTensor(N_BEST, "bytes", (-1,)), TritonTensor(N_BEST_SCORES, "float32", (-1,)),
                TritonTensor(N_BEST_COUNT, "int32", (1,)))


@dataclass(frozen=True)
class NativeGraph:
    """One graph as a native Triton model sees it: (name, dtype, dims without the batch axis) per tensor."""

    graph: Graph
    inputs: tuple[TritonTensor, ...]
    outputs: tuple[TritonTensor, ...]


def native_graphs(directory: ModelDir | EngineDir) -> dict[Graph, NativeGraph]:
    """Both graphs of a model or engine directory, from its manifest."""
    if isinstance(directory, EngineDir):
        return _engine_graphs(directory)
    entries = {g: directory.entry(g) for g in CONTRACT_GRAPHS}
    return {g: NativeGraph(g, *(tuple(_tensor(t["name"], t["dtype"], t["shape"]) for t in tensors)
                                for tensors in (entry.inputs, entry.outputs)))
            for g, entry in entries.items()}


def _engine_graphs(directory: EngineDir) -> dict[Graph, NativeGraph]:
    """Engines take the contract's tensors. TensorRT before 10 narrows int64 ids to int32 (TensorRT-RTX keeps
    int64); fp16 engines (from graphs made without --keep-io-types, the default) keep the cache and hidden state in
    fp16, logits in fp32."""
    narrow_ids = directory.target == TENSORRT and int(directory.library_version.split(".")[0]) < 10
    half = directory.precision == "fp16"

    def dtype(name: str, declared: str) -> str:
        if declared == "int64":
            return "int32" if narrow_ids else "int64"
        return "float16" if half and name != LOGITS else declared
    specs = contract_specs(directory.config)
    return {g: NativeGraph(g, *(tuple(_tensor(t.name, dtype(t.name, t.dtype), t.shape) for t in tensors)
                                for tensors in (spec.inputs, spec.outputs)))
            for g, spec in specs.items()}


def _tensor(name: str, dtype: str, shape: list | tuple) -> TritonTensor:
    return TritonTensor(name, dtype, tuple(d if isinstance(d, int) else -1 for d in shape[1:]))
