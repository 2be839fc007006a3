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

import onnx
import onnx_ir as ir
import onnxscript.optimizer
import torch

from ..core.graph_spec import SUPPORTED_OPSETS, Graph, GraphSpec, GraphVariant, graph_specs, variant_specs
from ..model.transformer import Transformer
from ..runtime.session import runs_fused_graphs
from . import symbolics
from .modules import DecoderStepGraph, EncoderGraph, example_inputs
from .onnx_io import ExportError, strip_exporter_metadata
from .search import SearchStepGraph, search_example_inputs
from .simplify import simplify, static_reshapes
from .weights import Key, Weight, bind, fold_transposes, weight_inputs

FUSED = GraphVariant.DECODER_STEP_SEARCH_FUSED
log = logging.getLogger(__name__)


@dataclass
class ExportedGraph:
    """A graph's structure, its weights still recipes over the model's tensors (graphs.weights) until `bind`."""

    graph: Graph | GraphVariant
    proto: onnx.ModelProto  # every weight a graph input named as in `weights`
    weights: dict[str, Weight]


def _dynamic_axes(spec: GraphSpec) -> dict[str, dict[int, str]]:
    """The spec's symbolic axes, inputs and outputs, as the TorchScript exporter takes them."""
    return {t.name: {axis: sym for axis, sym in enumerate(t.shape) if isinstance(sym, str)}
            for t in (*spec.inputs, *spec.outputs)}


def _module(model: Transformer, spec: GraphSpec) -> tuple[torch.nn.Module, tuple]:
    """The module a graph is exported from, and its tracing inputs."""
    if isinstance(spec.graph, GraphVariant):
        fused = not spec.graph.standard_ops
        return SearchStepGraph(model, fused), search_example_inputs(model, fused)
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


def trace(model: Transformer, spec: GraphSpec, opset: int) -> ExportedGraph:
    """torch.onnx export of one graph's structure, with the contract's input/output names and axes."""
    symbolics.register()
    module, args = _module(model, spec)
    buffer = io.BytesIO()
    with _quiet(), _buffers_as_inputs(module):
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


def projection_key(model: Transformer) -> frozenset[Key]:
    """The output projection's weight as graphs.weights keys it: every graph's MatMul reads it transposed, and where it
    is tied to an embedding table (a parameter under its first name in the model), the Gathers can read that too."""
    first = {id(p): name for name, p in model.named_parameters()}
    return frozenset({("tensor", f"model.{first[id(model.trg_word_prj.weight)]}")})


def _optimized(proto: onnx.ModelProto) -> onnx.ModelProto:
    """onnxscript's optimizer over the structure: the tracer's shape arithmetic folded, duplicates merged. The
    weights are inputs here, so nothing of theirs is computed."""
    model = onnxscript.optimizer.optimize(ir.serde.deserialize_model(proto))
    return ir.serde.serialize_model(model)


def export_graph(model: Transformer, spec: GraphSpec, opset: int, optimize: bool = True, one_file: bool = False,
                 simplified: bool = True) -> ExportedGraph:
    """One graph, traced and rewritten, its weights unbound. one_file: its weights will share one file with the
    other graphs' (graphs.saving's external layout), so no rewrite may give it a copy of its own: the tied table is
    read as W^T by every graph (in one file, the inline layout's contract graphs do so too; its variants keep W, the
    encoder's very table, for the runtime to share), and Q, K and V stay apart (merged, they would be a second copy
    of the decoder's attention weights). simplified: the variants' rewrites applied (graphs.simplify)."""
    exported = trace(model.eval(), spec, opset)
    strip_exporter_metadata(exported.proto)
    variant = isinstance(spec.graph, GraphVariant)
    fold_transposes(exported.proto, exported.weights, keep_gathered=variant and not one_file,
                    transposed=projection_key(model) if one_file else frozenset())
    if optimize:
        exported.proto = _optimized(static_reshapes(_optimized(exported.proto)))
    if simplified and variant:
        exported.proto = simplify(exported.proto, exported.weights, merge=not one_file)
    return exported


def export_specs(model: Transformer, opset: int, variants: bool = True) -> dict[Graph | GraphVariant, GraphSpec]:
    """The specs of the graphs an export writes: the contract's two, and the variants this ONNX Runtime runs."""
    if opset not in SUPPORTED_OPSETS:
        raise ExportError(f"opset {opset} is not supported; use one of {SUPPORTED_OPSETS}")
    specs = {**graph_specs(model.config), **(variant_specs(model.config) if variants else {})}
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
               variants: bool = True) -> dict[Graph | GraphVariant, onnx.ModelProto]:
    """Every graph, export_bound's way."""
    return {graph: export_bound(model, spec, opset, optimize)
            for graph, spec in export_specs(model, opset, variants).items()}
