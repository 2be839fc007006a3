"""PyTorch model -> encoder and decoder-step ONNX graphs, driven by the graph specs.

A fixed pipeline per graph: torch.onnx's TorchScript exporter traces the spec's module with the spec's names and
dynamic axes, its weights left out (graph inputs named by the model's parameters: graphs.weights) -> exporter debug
records dropped -> each Linear layer's transpose folded into its weight and the tied table stored once -> the
onnxscript optimizer over the structure -> the step variants simplified. The weights join the graph only when it
is saved (`bind`), inline or in an external file; the checks run on the saved file (onnx_io.check_contract), so a
graph of any size is checked without its weights ever being held in a protobuf.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import onnxscript.optimizer
import torch
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from ..core.graph_spec import SUPPORTED_OPSETS, Graph, GraphSpec, all_specs, contract_specs
from ..model.transformer import Transformer
from ..runtime.session import runs_fused_graphs
from . import symbolics
from .decoder_step_search import DecoderStepSearchGraph, decoder_step_search_inputs
from .modules import DecoderStepGraph, EncoderGraph, example_inputs
from .onnx_io import ExportError, strip_exporter_metadata
from .simplify import simplify, static_reshapes
from .weights import Weight, bind, fold_transposes, weight_inputs

FUSED = Graph.DECODER_STEP_SEARCH_FUSED
# lift_constants folds these when every input is a constant of at most FOLD_MAX_ELEMENTS (shapes, scalars)
FOLDABLE_OPS = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Concat", "Cast", "Gather", "Slice", "Add", "Sub",
                          "Mul", "Div", "Equal", "Where", "Range", "Expand", "ConstantOfShape", "Not", "Neg"})
FOLD_MAX_ELEMENTS = 1024
log = logging.getLogger(__name__)


@dataclass
class ExportedGraph:
    """A graph's structure, its weights still recipes over the model's tensors (graphs.weights) until `bind`."""

    graph: Graph
    proto: onnx.ModelProto  # every weight a graph input named as in `weights`
    weights: dict[str, Weight]


def _dynamic_axes(spec: GraphSpec) -> dict[str, dict[int, str]]:
    """The spec's symbolic axes, inputs and outputs, as the TorchScript exporter takes them."""
    return {t.name: {axis: sym for axis, sym in enumerate(t.shape) if isinstance(sym, str)}
            for t in (*spec.inputs, *spec.outputs)}


def _module(model: Transformer, spec: GraphSpec) -> tuple[torch.nn.Module, tuple]:
    """The module a graph is exported from, and its tracing inputs."""
    if spec.graph in (Graph.DECODER_STEP_SEARCH, FUSED):
        fused = spec.graph is FUSED
        return DecoderStepSearchGraph(model, fused), decoder_step_search_inputs(model, fused)
    module = EncoderGraph(model) if spec.graph is Graph.ENCODER else DecoderStepGraph(model)
    return module, example_inputs(model)[spec.graph.value]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporter's tracer warnings (a shape read as a Python number is a constant of the graph: the parity
    checks, at other shapes than the trace's, are what tells whether that is right) and its printed notes."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _buffers_as_inputs(module: torch.nn.Module) -> Iterator[None]:
    """Every buffer a weight input while tracing: the exporter inlines the non-persistent ones (RoPE's cos and sin
    tables, T5's bucket table) as anonymous constants otherwise, and they are the model's tables, found by their
    names (graphs.roles) and stored as any weight is."""
    hidden = [(m, set(m._non_persistent_buffers_set)) for m in module.modules() if m._non_persistent_buffers_set]
    for m, _ in hidden:
        m._non_persistent_buffers_set.clear()
    try:
        yield
    finally:
        for m, names in hidden:
            m._non_persistent_buffers_set.update(names)


@contextlib.contextmanager
def _shape_inference_without_weights() -> Iterator[None]:
    """The TorchScript exporter's whole-graph shape inference given no weights: it would serialize every weight into
    a protobuf to infer the shapes the weight inputs' types already give (for a 600M-parameter model, 11 s and a
    copy of the encoder's weights for the encoder alone); it infers the very same graph without them (tests)."""
    real = torch._C._jit_pass_onnx_graph_shape_type_inference
    torch._C._jit_pass_onnx_graph_shape_type_inference = lambda graph, params, opset: real(graph, {}, opset)
    try:
        yield
    finally:
        torch._C._jit_pass_onnx_graph_shape_type_inference = real


def trace(model: Transformer, spec: GraphSpec, opset: int) -> ExportedGraph:
    """torch.onnx export of one graph's structure, with the contract's input/output names and axes."""
    symbolics.register()
    module, args = _module(model, spec)
    buffer = io.BytesIO()
    with _quiet(), _buffers_as_inputs(module), _shape_inference_without_weights():
        torch.onnx.export(module.eval(), args, buffer, dynamo=False, opset_version=opset, export_params=False,
                          do_constant_folding=False, input_names=[t.name for t in spec.inputs],
                          output_names=[t.name for t in spec.outputs], dynamic_axes=_dynamic_axes(spec))
    proto = onnx.load_from_string(buffer.getvalue())
    _declare_shapes(proto, spec)
    tensors = {**dict(module.named_buffers()), **dict(module.named_parameters())}
    return ExportedGraph(spec.graph, proto, weight_inputs(proto, tensors))


def _declare_shapes(proto: onnx.ModelProto, spec: GraphSpec) -> None:
    """The outputs' shapes as the contract declares them: the tracer names a size it cannot follow (the step's one
    new token) with a symbol of its own. Shape inference holds the graph to what is declared (check_saved)."""
    declared = {t.name: t.shape for t in spec.outputs}
    for value in proto.graph.output:
        dims = value.type.tensor_type.shape.dim
        for dim, size in zip(dims, declared[value.name], strict=True):
            dim.Clear()
            if isinstance(size, str):
                dim.dim_param = size
            else:
                dim.dim_value = size


def _optimized(proto: onnx.ModelProto) -> onnx.ModelProto:
    """onnxscript's optimizer over the structure, twice around static_reshapes: the tracer's shape arithmetic
    folded, duplicates merged, Reshapes given constant shapes. A small model's step runs nodes, not GEMMs, and every
    node counts; the weights are inputs here, so nothing of theirs is computed."""
    return _optimizer_pass(static_reshapes(_optimizer_pass(proto)))


def lift_constants(proto: onnx.ModelProto) -> None:
    """The tracer's Constant nodes as initializers, and the small sums of them (a Reshape of two constants) computed
    by onnx's reference evaluator, in one pass over the nodes: what the optimizer would make of them, where
    TensorRT and the checks read a constant (a TopK's K), at a fraction of its cost on a large graph."""
    graph, kept = proto.graph, []
    known = {i.name: i for i in graph.initializer if np.prod(i.dims, dtype=np.int64) <= FOLD_MAX_ELEMENTS}
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    for node in graph.node:
        values = _constant_outputs(node, known, opset)
        if values is None:
            kept.append(node)
            continue
        for name, value in zip(node.output, values, strict=True):
            tensor = value if isinstance(value, onnx.TensorProto) else numpy_helper.from_array(np.asarray(value), name)
            tensor.name = name
            graph.initializer.append(tensor)
            known[name] = tensor
    del graph.node[:]
    graph.node.extend(kept)


def _constant_outputs(node: onnx.NodeProto, known: dict[str, onnx.TensorProto], opset: int) -> list | None:
    """A node's outputs where it is a Constant, or a small standard op of constants; None otherwise."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Constant":
        if len(node.attribute) != 1 or node.attribute[0].name != "value":
            return None
        tensor = onnx.TensorProto()
        tensor.CopyFrom(node.attribute[0].t)
        return [tensor]
    if node.op_type not in FOLDABLE_OPS or not all(i in known for i in node.input if i):
        return None
    evaluator = ReferenceEvaluator(onnx.helper.make_graph([node], "fold", [], [
        onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output],
        [known[i] for i in node.input if i]), opsets={"": opset})
    values = evaluator.run(None, {})
    return values if all(np.asarray(v).size <= FOLD_MAX_ELEMENTS for v in values) else None


def _optimizer_pass(proto: onnx.ModelProto) -> onnx.ModelProto:
    return ir.serde.serialize_model(onnxscript.optimizer.optimize(ir.serde.deserialize_model(proto)))


def export_graph(model: Transformer, spec: GraphSpec, opset: int, optimize: bool = True, one_file: bool = False,
                 simplified: bool = True) -> ExportedGraph:
    """One graph, traced and rewritten, its weights unbound. one_file: its weights will share one file with the
    other graphs' (graphs.saving's external layout), so no rewrite may give it a copy of its own: every graph keeps
    the tied table W itself, the encoder's very table, for the runtime to map once and give every session (the
    projection's W^T is a Transpose ONNX Runtime folds, packs and frees when a session opens; the inline layout's
    contract graphs store W^T instead, and their Gathers read it along axis 1: a gather that touches every page of
    a large table), and Q, K and V stay apart (merged, they would be a second copy of the decoder's attention
    weights); and the optimizer is left to ONNX Runtime, which folds the same shape arithmetic when a session
    opens (on a 24-layer graph onnxscript's takes 6-14 s a pass, a minute of a 1.3B export, for node counts that
    do not matter beside its GEMMs). simplified: the rewrites applied where the spec allows them (graphs.simplify)."""
    exported = trace(model.eval(), spec, opset)
    strip_exporter_metadata(exported.proto)
    fold_transposes(exported.proto, exported.weights, keep_gathered=spec.shares_table or one_file)
    if optimize and not one_file:
        exported.proto = _optimized(exported.proto)
    elif optimize:
        lift_constants(exported.proto)
    if simplified and spec.simplified:
        exported.proto = simplify(exported.proto, exported.weights, merge=not one_file)
    return exported


def export_specs(model: Transformer, opset: int, variants: bool = True) -> dict[Graph, GraphSpec]:
    """The specs of the graphs an export writes: the contract's two, and the variants this ONNX Runtime runs."""
    if opset not in SUPPORTED_OPSETS:
        raise ExportError(f"opset {opset} is not supported; use one of {SUPPORTED_OPSETS}")
    specs = all_specs(model.config) if variants else contract_specs(model.config)
    if not runs_fused_graphs() and FUSED in specs:  # its parity could not be checked here, nor would it run here
        log.warning("onnxruntime is older than %s needs; exporting without it", FUSED.filename)
        specs.pop(FUSED)
    return specs


def export_bound(model: Transformer, spec: GraphSpec, opset: int, optimize: bool = True) -> onnx.ModelProto:
    """One graph with its weights inline, in memory: for models well below protobuf's 2 GB (tests, tools)."""
    exported = export_graph(model, spec, opset, optimize)
    bind(exported.proto, exported.weights)
    return exported.proto


def export_all(model: Transformer, opset: int, optimize: bool = True,
               variants: bool = True) -> dict[Graph, onnx.ModelProto]:
    """Every graph, export_bound's way."""
    return {graph: export_bound(model, spec, opset, optimize)
            for graph, spec in export_specs(model, opset, variants).items()}
