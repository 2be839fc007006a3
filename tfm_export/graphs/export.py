"""PyTorch model -> encoder and decoder-step ONNX graphs, driven by the graph specs.

A fixed pipeline per graph: torch.onnx (dynamo) export with the spec's names and dynamic axes
-> exporter debug metadata dropped -> one copy of every weight -> checker with full shape
inference -> contract checks (no If/Loop, names, axis symbols). The steps after the export are
PyTorch-free (onnx_io), so later stages reuse them without loading torch.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import onnx
import onnxruntime
import torch
from torch.export import Dim

from ..core.graph_spec import (
    SUPPORTED_OPSETS,
    TOTAL_LENGTH,
    Graph,
    GraphSpec,
    GraphVariant,
    graph_specs,
    variant_specs,
)
from ..model.transformer import Transformer
from ..runtime.session import runs_fused_graphs
from .buffer_cache import write_at
from .modules import DecoderStepGraph, EncoderGraph, example_inputs
from .onnx_io import ExportError, check_contract, share_tied_weights, strip_exporter_metadata
from .search import SearchStepGraph, search_example_inputs
from .simplify import simplify

FUSED = GraphVariant.DECODER_STEP_SEARCH_FUSED
log = logging.getLogger(__name__)


def _dynamic_shapes(spec: GraphSpec) -> tuple:
    """The spec's symbolic axes as torch.export Dims; trailing inputs (the cache, after the fused step's total
    length) as one nested tuple (*past)."""
    dims: dict[str, Dim] = {}
    shapes = [{axis: dims.setdefault(sym, Dim(sym.replace(" ", ""))) for axis, sym in enumerate(t.shape)
               if isinstance(sym, str)} for t in spec.inputs]
    past = next((i for i, t in enumerate(spec.inputs) if t.name.startswith("past_key_values") or
                 t.name == TOTAL_LENGTH), None)  # SearchStepGraph takes the fused step's total length in *past
    return tuple(shapes) if past is None else (*shapes[:past], tuple(shapes[past:]))


def _module(model: Transformer, spec: GraphSpec) -> tuple[torch.nn.Module, tuple]:
    """The module a graph is exported from, and its tracing inputs."""
    if isinstance(spec.graph, GraphVariant):
        fused = not spec.graph.standard_ops
        return SearchStepGraph(model, fused), search_example_inputs(model, fused)
    module = EncoderGraph(model) if spec.graph is Graph.ENCODER else DecoderStepGraph(model)
    return module, example_inputs(model)[spec.graph.value]


def export_graph(model: Transformer, spec: GraphSpec, opset: int, optimize: bool = True) -> onnx.ModelProto:
    """torch.onnx export of one graph, with the contract's input/output names and axes."""
    module, args = _module(model, spec)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        # the exporter's progress notes and opset-conversion notices; its failed down-conversion (RMSNorm's
        # ReduceMean) logs a traceback, and _at_opset converts after it
        for name in ("torch", "onnxscript"):
            logging.getLogger(name).setLevel(logging.ERROR)
        program = torch.onnx.export(
            module.eval(), args, dynamo=True, opset_version=opset, optimize=optimize, verbose=False,
            input_names=[t.name for t in spec.inputs], output_names=[t.name for t in spec.outputs],
            dynamic_shapes=_dynamic_shapes(spec), custom_translation_table=_translations())
    return _at_opset(program.model_proto, opset)


def _translations() -> dict:
    """buffer_cache.write_at as the one ONNX node it stands for."""
    from onnxscript import opset18 as op

    def scatter_nd(buffer, index, update):
        return op.ScatterND(buffer, index, update)
    return {torch.ops.tfm.write_at.default: scatter_nd, write_at: scatter_nd}


def _at_opset(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """torch.onnx exports at 18 and converts down before optimising; a ReduceMean (RMSNorm) then still reads
    its axes through a Reshape the converter cannot see through, and the graph silently stays at 18. After
    the optimizer has folded the axes into an initializer, ONNX's own converter succeeds."""
    if _opset_of(proto) == opset:
        return proto
    try:
        proto = onnx.version_converter.convert_version(proto, opset)
    except (RuntimeError, onnx.checker.ValidationError) as exc:
        raise ExportError(f"cannot express this model at opset {opset} ({str(exc).splitlines()[0][:200]}); "
                          f"export with --opset {_opset_of(proto)}") from None
    if _opset_of(proto) != opset:
        raise ExportError(f"the exporter produced opset {_opset_of(proto)}, not {opset}; export with --opset "
                          f"{_opset_of(proto)}")
    _drop_newer_attributes(proto, opset)
    return proto


def _drop_newer_attributes(proto: onnx.ModelProto, opset: int) -> None:
    """The converter carries attributes the target opset does not define (ReduceMean's opset-18
    noop_with_empty_axes) into the converted nodes; at their default 0 they change nothing and are dropped."""
    for node in [n for n in proto.graph.node if n.domain in ("", "ai.onnx")]:  # not ONNX Runtime's own ops
        known = onnx.defs.get_schema(node.op_type, opset, node.domain).attributes
        for attr in [a for a in node.attribute if a.name not in known]:
            if onnx.helper.get_attribute_value(attr) != 0:
                raise ExportError(f"{node.op_type} uses {attr.name}, which opset {opset} lacks; export with "
                                  "--opset 18")
            node.attribute.remove(attr)


def _opset_of(proto: onnx.ModelProto) -> int:
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def export_all(model: Transformer, opset: int, optimize: bool = True,
               variants: bool = True) -> dict[Graph | GraphVariant, onnx.ModelProto]:
    """Both graphs (and the variants, GraphVariant), exported, de-duplicated and checked."""
    if opset not in SUPPORTED_OPSETS:
        raise ExportError(f"opset {opset} is not supported; use one of {SUPPORTED_OPSETS}")
    graphs = {}
    specs = {**graph_specs(model.config), **(variant_specs(model.config) if variants else {})}
    if not runs_fused_graphs():  # its parity could not be checked here, nor would this runtime run it
        log.warning("onnxruntime %s is older than %s needs; exporting without it", onnxruntime.__version__,
                    FUSED.filename)
        specs.pop(FUSED, None)
    for graph, spec in specs.items():
        proto = export_graph(model.eval(), spec, opset, optimize)
        strip_exporter_metadata(proto)
        removed = share_tied_weights(proto, keep_embedding=isinstance(graph, GraphVariant))
        log.info("%s: exported, %d duplicate weight copies removed", graph.filename, removed)
        graphs[graph] = check_contract(simplify(proto) if isinstance(graph, GraphVariant) else proto, spec)
    return graphs
