"""PyTorch model -> encoder and decoder-step ONNX graphs, driven by the graph specs.

A fixed pipeline per graph: torch.onnx (dynamo) export with the spec's names and dynamic axes
-> exporter debug metadata dropped -> one copy of every weight -> checker with full shape
inference -> contract checks (no If/Loop, names, axis symbols). Each step is a small function so
tests and later stages can reuse it.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from torch.export import Dim

from .errors import TfmExportError, first_line
from .graph_modules import DecoderStepGraph, EncoderGraph, example_inputs
from .graph_spec import Graph, GraphSpec, graph_specs
from .model import Transformer

SUPPORTED_OPSETS = (17, 18)
FORBIDDEN_OPS = {"If", "Loop", "Scan"}  # TensorRT rejects control flow in these graphs
EXTERNAL_DATA_BYTES = 2 * 1024 ** 3 - 64 * 1024 ** 2  # protobuf's 2 GB limit, with headroom

log = logging.getLogger(__name__)


class ExportError(TfmExportError):
    """The exporter produced a graph that breaks the contract."""


def _dynamic_shapes(spec: GraphSpec) -> tuple:
    """The spec's symbolic axes as torch.export Dims; trailing cache inputs as one nested tuple (*past)."""
    dims: dict[str, Dim] = {}
    shapes = [{axis: dims.setdefault(sym, Dim(sym.replace(" ", ""))) for axis, sym in enumerate(t.shape)
               if isinstance(sym, str)} for t in spec.inputs]
    return (shapes[0], shapes[1], tuple(shapes[2:])) if spec.graph is Graph.DECODER_STEP else tuple(shapes)


def export_graph(model: Transformer, spec: GraphSpec, opset: int, optimize: bool = True) -> onnx.ModelProto:
    """torch.onnx export of one graph, with the contract's input/output names and axes."""
    module = EncoderGraph(model) if spec.graph is Graph.ENCODER else DecoderStepGraph(model)
    args = example_inputs(model)[spec.graph.value]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        logging.getLogger("torch").setLevel(logging.ERROR)
        program = torch.onnx.export(
            module.eval(), args, dynamo=True, opset_version=opset, optimize=optimize, verbose=False,
            input_names=[t.name for t in spec.inputs], output_names=[t.name for t in spec.outputs],
            dynamic_shapes=_dynamic_shapes(spec))
    return program.model_proto


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
    for the logits MatMul; the Gather is rewritten to read W^T along axis 1 and W is dropped.
    Exact duplicates are merged too. Returns how many initializers were removed."""
    graph = proto.graph
    arrays = {init.name: numpy_helper.to_array(init) for init in graph.initializer if len(init.dims) == 2}
    removed = 0
    by_bytes: dict[tuple, str] = {}
    for name, arr in arrays.items():
        key = (arr.shape, arr.dtype.str, arr.tobytes())
        if key in by_bytes:
            _rename_input(graph, name, by_bytes[key])
            removed += _drop_initializer(graph, name)
        else:
            by_bytes[key] = name
    for name, arr in arrays.items():
        for other, other_arr in arrays.items():
            if name != other and arr.shape == other_arr.shape[::-1] and arr.shape[0] != arr.shape[1] \
                    and np.array_equal(arr, other_arr.T) and _only_gathers(graph, name):
                removed += _gather_from_transposed(graph, name, other)
                break
    return removed


def _only_gathers(graph: onnx.GraphProto, name: str) -> bool:
    users = _consumers(graph, name)
    return bool(users) and all(n.op_type == "Gather" and n.input[0] == name and
                               all(a.i == 0 for a in n.attribute if a.name == "axis") for n in users)


def _gather_from_transposed(graph: onnx.GraphProto, weight: str, transposed: str) -> int:
    """Gather(W, ids) (..., C) == Transpose(Gather(W^T, ids, axis=1)) with the C axis moved last."""
    for node in [n for n in graph.node if n.op_type == "Gather" and n.input[0] == weight]:
        gathered = f"{node.output[0]}__from_{transposed}"
        new_gather = helper.make_node("Gather", [transposed, node.input[1]], [gathered], axis=1,
                                      name=f"{node.name}_transposed")
        # Gather(W^T, ids of rank r, axis=1) -> (C, *ids.shape); move C last.
        rank = _rank_of(graph, node.input[1])
        move = helper.make_node("Transpose", [gathered], [node.output[0]], perm=[*range(1, rank + 1), 0],
                                name=f"{node.name}_channels_last")
        index = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(index, move)
        graph.node.insert(index, new_gather)
    return _drop_initializer(graph, weight)


def _rank_of(graph: onnx.GraphProto, name: str) -> int:
    for value in [*graph.input, *graph.value_info]:
        if value.name == name:
            return len(value.type.tensor_type.shape.dim)
    raise ExportError(f"cannot tell the rank of {name} to rewrite its Gather")


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


def check_graph(proto: onnx.ModelProto, spec: GraphSpec) -> onnx.ModelProto:
    """ONNX checker + strict shape inference, then the contract: names, axes, no control flow."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)
        onnx.checker.check_model(inferred, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ExportError(f"{spec.graph.filename}: ONNX checker failed: {first_line(exc)}") from None
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


def export_all(model: Transformer, opset: int, optimize: bool = True) -> dict[Graph, onnx.ModelProto]:
    """Both graphs, exported, de-duplicated and checked."""
    if opset not in SUPPORTED_OPSETS:
        raise ExportError(f"opset {opset} is not supported; use one of {SUPPORTED_OPSETS}")
    graphs = {}
    for graph, spec in graph_specs(model.config).items():
        proto = export_graph(model.eval(), spec, opset, optimize)
        strip_exporter_metadata(proto)
        removed = share_tied_weights(proto)
        log.info("%s: exported, %d duplicate weight copies removed", graph.filename, removed)
        graphs[graph] = check_graph(proto, spec)
    return graphs


def save_graph(proto: onnx.ModelProto, path: Path, external_above: int = EXTERNAL_DATA_BYTES) -> list[Path]:
    """Weights inline below 2 GB, in `<name>.onnx.data` above. Returns the files written."""
    size = sum(len(init.raw_data) for init in proto.graph.initializer)
    if size < external_above:
        onnx.save_model(proto, path)
        return [path]
    data = path.with_name(path.name + ".data")
    onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
    return [path, data]
