"""ONNX graphs as files and as contracts, without PyTorch: load, save, check against the graph spec,
and the rewrites every producer of graphs shares (exporter metadata dropped, tied weights stored once).

The exporter (torch), the precision converters and the TensorRT checks all use these, so quantizing
or checking a directory never loads PyTorch.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

from ..artifacts.model_dir import SHARED_DTYPES, SHARED_MIN_BYTES, ModelDir, ModelDirError
from ..artifacts.records import ModelManifest
from ..core.errors import TfmExportError, first_line
from ..core.graph_spec import Graph, GraphSpec
from .weights import gather_from_transposed

FORBIDDEN_OPS = {"If", "Loop", "Scan"}  # TensorRT rejects control flow in these graphs
EXTERNAL_DATA_BYTES = 2 * 1024 ** 3 - 64 * 1024 ** 2  # protobuf's 2 GB limit, with headroom


class ExportError(TfmExportError):
    """A graph that breaks the contract."""


def strip_exporter_metadata(proto: onnx.ModelProto) -> None:
    """Drop the exporter's per-node debug records (stack traces with this machine's file paths, FX node text):
    they leak the build machine's layout into a portable artifact and change the graph's hash whenever a line
    of the Python source moves."""
    for node in proto.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    for value in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        del value.metadata_props[:]
    for init in proto.graph.initializer:
        del init.metadata_props[:]


def _consumers(graph: onnx.GraphProto, name: str) -> list[onnx.NodeProto]:
    return [n for n in graph.node if name in n.input]


def share_tied_weights(proto: onnx.ModelProto) -> int:
    """Store a tied embedding/output weight once: the exporter keeps W for Gather and a folded W^T
    for the logits MatMul; the Gather is rewritten to read W^T along axis 1 and W is dropped. Exact duplicates
    are merged too. Each matrix is read once for a sample of its values, so that a graph of gigabytes is not held
    twice; only matrices whose samples match are compared in full. Returns how many initializers were removed."""
    graph = proto.graph
    inits = {init.name: init for init in graph.initializer if len(init.dims) == 2}
    removed = 0
    by_sample: dict[tuple, list[str]] = {}
    for name, init in inits.items():
        arr = numpy_helper.to_array(init)
        key = (arr.shape, arr.dtype.str, _sample(arr))
        twin = next((other for other in by_sample.get(key, [])
                     if np.array_equal(arr, numpy_helper.to_array(inits[other]))), None)
        if twin is None:
            by_sample.setdefault(key, []).append(name)
        else:
            _rename_input(graph, name, twin)
            removed += _drop_initializer(graph, name)
    kept = {init.name for init in graph.initializer}
    for name in [n for n in inits if n in kept and only_gathers(graph, n)]:
        table = numpy_helper.to_array(inits[name])
        transposed = next((other for other, init in inits.items() if other != name and other in kept and
                           tuple(init.dims) == table.shape[::-1] and table.shape[0] != table.shape[1] and
                           np.array_equal(table, numpy_helper.to_array(init).T)), None)
        if transposed is not None:
            gather_from_transposed(graph, name, transposed)
            removed += _drop_initializer(graph, name)
    return removed


def _sample(arr: np.ndarray, count: int = 4096) -> bytes:
    """Evenly spaced values of a matrix: equal for equal matrices, and nearly never for different weights."""
    flat = arr.reshape(-1)
    return flat[::max(1, flat.size // count)].tobytes()


def only_gathers(graph: onnx.GraphProto, name: str) -> bool:
    users = _consumers(graph, name)
    return bool(users) and all(n.op_type == "Gather" and n.input[0] == name and
                               all(a.i == 0 for a in n.attribute if a.name == "axis") for n in users)


def _rename_input(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for j, name in enumerate(node.input):
            if name == old:
                node.input[j] = new


def _drop_initializer(graph: onnx.GraphProto, name: str) -> int:
    for init in graph.initializer:
        if init.name == name:
            graph.initializer.remove(init)
            return 1
    return 0


def check_contract(proto: onnx.ModelProto, spec: GraphSpec) -> onnx.ModelProto:
    """ONNX checker + strict shape inference, then the contract: names, axes, no control flow. `proto` holds its
    weights (below protobuf's 2 GB); a saved graph of any size: check_saved."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)
        onnx.checker.check_model(inferred, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ExportError(f"{spec.graph.filename}: ONNX checker failed: {first_line(exc)}") from None
    return _contract(inferred, spec)


def check_saved(path: Path, spec: GraphSpec) -> onnx.ModelProto:
    """check_contract on a saved graph file, its external weights found beside it but never read: the checker and
    shape inference by path; returns the inferred structure, without the external weights."""
    try:
        onnx.checker.check_model(str(path), full_check=True)
        structure = onnx.load_model(str(path), load_external_data=False)
        inferred = onnx.shape_inference.infer_shapes(structure, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ExportError(f"{spec.graph.filename}: ONNX checker failed: {first_line(exc)}") from None
    return _contract(inferred, spec)


def _contract(inferred: onnx.ModelProto, spec: GraphSpec) -> onnx.ModelProto:
    bad_ops = sorted({n.op_type for n in inferred.graph.node} & FORBIDDEN_OPS)
    if bad_ops:
        raise ExportError(f"{spec.graph.filename}: contains {', '.join(bad_ops)} nodes, which TensorRT rejects")
    for kind, values, specs in (("input", inferred.graph.input, spec.inputs),
                                ("output", inferred.graph.output, spec.outputs)):
        got = [(v.name, tuple(d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim)) for v in values]
        for found, wanted in itertools.zip_longest(got, [(t.name, t.shape) for t in specs]):
            if found != wanted:
                raise ExportError(f"{spec.graph.filename}: {kind} {found} should be {wanted} per the graph contract")
    return inferred


def save_graph(proto: onnx.ModelProto, path: Path, external_above: int = EXTERNAL_DATA_BYTES) -> list[Path]:
    """Weights inline below 2 GB, in `<name>.onnx.data` above. Returns the files written."""
    size = sum(len(init.raw_data) for init in proto.graph.initializer)
    if size < external_above:
        onnx.save_model(proto, path)
        return [path]
    data = path.with_name(path.name + ".data")
    onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
    return [path, _readable_as(data, path)]


def _readable_as(data: Path, graph: Path) -> Path:
    """onnx creates external data files private to their owner; give them the graph's permissions."""
    data.chmod(graph.stat().st_mode & 0o777)
    return data


def save_sharing_graph(proto: onnx.ModelProto, path: Path, encoder: onnx.ModelProto, table: tuple[int, int]
                       ) -> tuple[list[Path], list[dict]]:
    """save_graph, with the tied embedding table (shape `table`) in `<name>.onnx.data` where the encoder holds
    the very same tensor (name, type, bytes): standard external data any ONNX runtime reads. Returns the files
    written and the manifest's shared_initializers entries (name, dtype, shape, offset)."""
    theirs = {t.name: t for t in encoder.graph.initializer}
    shared = [t for t in proto.graph.initializer if t.name in theirs and tuple(t.dims) == tuple(table)
              and len(t.raw_data) >= SHARED_MIN_BYTES and _same_tensor(t, theirs[t.name])
              and helper.tensor_dtype_to_np_dtype(t.data_type).name in SHARED_DTYPES.values()]
    data = path.with_name(path.name + ".data")
    for tensor in shared:
        external_data_helper.set_external_data(tensor, data.name)
        tensor.data_location = onnx.TensorProto.EXTERNAL
    files = save_graph(proto, path)
    entries = [{"name": t.name, "dtype": helper.tensor_dtype_to_np_dtype(t.data_type).name, "shape": list(t.dims),
                "offset": int(next(e.value for e in t.external_data if e.key == "offset"))} for t in shared]
    return (files if not shared or data in files else [*files, _readable_as(data, path)]), entries


def save_graph_of(spec: GraphSpec, proto: onnx.ModelProto, directory: Path, encoder: onnx.ModelProto,
                  table: tuple[int, int]) -> tuple[list[Path], list[dict]]:
    """Saves a directory's graph: those that share the tied table (decoder_step_search, which only this tool's
    runtime opens) keep the encoder's copy of it, (vocabulary, d_model) (artifacts.model_dir.SHARED); the
    contract's graphs keep theirs inline."""
    if spec.shares_table:
        return save_sharing_graph(proto, directory / spec.graph.filename, encoder, table)
    return save_graph(proto, directory / spec.graph.filename), []


def sharing_note(graph: str) -> str:
    """What `optimizations` says of a graph that shares the tied table (add_shared)."""
    return (f"{graph} keeps the tied embedding table it shares with the encoder in its .data file; tfm-run reads "
            "it once for both sessions")


def add_shared(manifest: ModelManifest, shared: dict[Graph, list[dict]]) -> None:
    """Records save_graph_of's entries in the graphs' manifest entries, and says so in `optimizations`."""
    for graph, entries in shared.items():
        if entries:
            manifest.graphs[graph.value].shared = entries
            manifest.note(sharing_note(graph.value))


def _same_tensor(a: onnx.TensorProto, b: onnx.TensorProto) -> bool:
    return a.data_type == b.data_type and list(a.dims) == list(b.dims) and a.raw_data == b.raw_data


def load_graph(directory: ModelDir, graph: str, external_data: bool = True, check: bool = True) -> onnx.ModelProto:
    """The graph's ModelProto (sha256 checked, unless the caller checked the directory); a file that does not parse
    is one line, not a protobuf trace."""
    path = directory.graph_path(graph) if check else directory.path / directory.entry(graph).file
    try:
        proto = onnx.load_model(str(path), load_external_data=external_data)
    except Exception as exc:  # protobuf DecodeError, onnx's own errors, OSError for external data
        raise ModelDirError(f"{path}: not a readable ONNX graph ({type(exc).__name__}); export the model again") \
            from None
    _check_precision(proto, directory.precision, path)
    return proto


def graph_weight_bytes(directory: ModelDir, graph: str) -> int:
    """The bytes of a graph's initializers, read from its structure (a file that does not parse is load_graph's one
    line)."""
    return weight_bytes(load_graph(directory, graph, external_data=False, check=False))


def weight_bytes(proto: onnx.ModelProto) -> int:
    """The bytes of a graph's initializers: an external one by its recorded length, an inline one by its size in
    the file."""
    return sum(int(external_data_helper.ExternalDataInfo(init).length or 0)
               if init.data_location == onnx.TensorProto.EXTERNAL else init.ByteSize()
               for init in proto.graph.initializer)


# The weight type each precision's graphs must hold, and the types an fp32 graph may not (the manifest is not
# hashed: an edited `precision` would make inspect and check describe graphs that are not there).
_WEIGHTS = {"fp16": onnx.TensorProto.FLOAT16, "int8": onnx.TensorProto.INT8}


def _check_precision(proto: onnx.ModelProto, precision: object, path: Path) -> None:
    types = {init.data_type for init in proto.graph.initializer}
    wrong = (_WEIGHTS[precision] not in types) if precision in _WEIGHTS else bool(types & set(_WEIGHTS.values()))
    if wrong:
        raise ModelDirError(f"{path}: its weights do not match the manifest's precision {precision!r}; the manifest "
                            "was edited or belongs to other graphs; export or quantize the model again")


def tensors_of(values) -> list[dict[str, Any]]:
    """Graph inputs or outputs as the manifest lists them: name, dtype, shape (axis symbols or sizes)."""
    return [{"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
             "shape": [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]} for v in values]
