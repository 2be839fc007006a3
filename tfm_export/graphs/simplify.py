"""Rewrites that leave a graph's maths exactly as it is and take nodes out of it, for the one-token step graphs
whose run is mostly per-node overhead on a small model (each node costs ONNX Runtime about a microsecond on
the CPU, whatever it computes):
- a Reshape, or a chain of them, back to the shape its input already had (the exporter's head splits and merges
  of one token or of a source's rows) is dropped;
- MatMuls that multiply one input by constant weights of the same height (a layer's Q, K and V projections)
  become one MatMul by the weights side by side and a Split: one GEMM instead of three.
The contract's graphs are left byte-identical; these run on graphs only this tool's runtimes open.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

from .weights import Weight, add_weight, drop_unread


def simplify(proto: onnx.ModelProto, weights: dict[str, Weight], merge: bool = True) -> onnx.ModelProto:
    """weights: the graph's unbound weights (graphs.weights), its inputs until it is saved; merged ones join them.
    merge: the sibling MatMuls merged (a copy of their weights side by side)."""
    if merge:
        proto = merge_sibling_matmuls(proto, weights)
    return drop_identity_reshapes(proto)


def _shapes(proto: onnx.ModelProto) -> dict[str, list[int | str]]:
    """Every value's inferred shape: sizes, or the axis symbols of dynamic ones. ONNX Runtime's symbolic inference,
    which follows sizes through Range, Shape arithmetic and its own attention operators where onnx's stops (an
    unknown size gets a symbol of its own, merged with the one it equals); onnx's where it cannot run."""
    try:
        inferred = SymbolicShapeInference.infer_shapes(proto, auto_merge=True, guess_output_rank=True)
    except Exception:  # an operator it has no rule for: onnx's inference, which knows less
        inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    values = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    return {v.name: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim]
            for v in values if v.type.tensor_type.HasField("shape")}


def _known(shape: list[int | str] | None) -> bool:
    return shape is not None and all(d != 0 and d != "" for d in shape)


def static_reshapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A Reshape whose target shape the graph computes from other tensors' shapes (the tracer's Shape -> Gather ->
    Unsqueeze -> Concat for every view a module takes) reads a constant instead where inference knows the target in
    terms of the input's own axes: a size, 0 for "this axis of the input" (ONNX's copy), and -1 for at most one
    other axis. The shape arithmetic it no longer reads is removed: fewer nodes per step, the same values."""
    graph, shapes = proto.graph, _shapes(proto)
    constants = {i.name for i in graph.initializer}
    for node in [n for n in graph.node if n.op_type == "Reshape" and n.input[1] not in constants]:
        target = _copying(shapes.get(node.input[0]), shapes.get(node.output[0]))
        if target is not None:
            name = f"{node.name}_shape"
            graph.initializer.append(numpy_helper.from_array(np.array(target, np.int64), name))
            node.input[1] = name
    return _without_unread(proto)


def _copying(source: list[int | str] | None, want: list[int | str] | None) -> list[int] | None:
    if not _known(source) or not _known(want):
        return None
    target = [d if isinstance(d, int) else 0 if i < len(source) and source[i] == d else -1 for i, d in enumerate(want)]
    return target if target.count(-1) <= 1 else None


def drop_identity_reshapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A Reshape, or a chain of them, whose output has the very shape (sizes and axis symbols, as inferred) of the
    tensor the chain started from is that tensor: its readers read it instead."""
    graph, shapes = proto.graph, _shapes(proto)
    producers = {out: node for node in graph.node for out in node.output}
    outputs = {o.name for o in graph.output}
    replaced: dict[str, str] = {}
    for node in [n for n in graph.node if n.op_type == "Reshape" and n.output[0] not in outputs]:
        want, source = shapes.get(node.output[0]), node.input[0]
        while _known(want):
            if shapes.get(source) == want:
                replaced[node.output[0]] = source
                break
            parent = producers.get(source)
            if parent is None or parent.op_type != "Reshape":
                break
            source = parent.input[0]
    for reader in graph.node:
        for i, name in enumerate(reader.input):
            while name in replaced:
                name = replaced[name]
            reader.input[i] = name
    return _without_unread(proto)


def merge_sibling_matmuls(proto: onnx.ModelProto, weights: dict[str, Weight]) -> onnx.ModelProto:
    graph = proto.graph
    by_input: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights and len(weights[node.input[1]].shape) == 2:
            by_input.setdefault(node.input[0], []).append(node)
    for source, nodes in by_input.items():
        parts = [weights[n.input[1]] for n in nodes]
        if len(nodes) < 2 or len({w.shape[0] for w in parts}) > 1 or len({w.dtype for w in parts}) > 1:
            continue
        merged = f"{nodes[0].output[0]}__merged"
        add_weight(proto, weights, f"{merged}_weight", Weight.concatenated(parts, axis=1))
        widths = numpy_helper.from_array(np.array([w.shape[1] for w in parts], np.int64), f"{merged}_widths")
        graph.initializer.append(widths)
        first = list(graph.node).index(nodes[0])
        graph.node.insert(first, helper.make_node("Split", [merged, widths.name], [n.output[0] for n in nodes],
                                                  axis=-1, name=f"{merged}_split"))
        graph.node.insert(first, helper.make_node("MatMul", [source, f"{merged}_weight"], [merged], name=merged))
        for node in nodes:
            graph.node.remove(node)
    proto = _without_unread(proto)
    drop_unread(proto, weights)
    return proto


def _without_unread(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Nodes whose outputs nothing reads (the dropped Reshapes, the merged MatMuls) and initializers no node reads
    any more, removed; the last node first, so that a chain goes whole."""
    graph = proto.graph
    needed = {o.name for o in graph.output}
    for node in reversed(list(graph.node)):
        if any(out in needed for out in node.output):
            needed.update(node.input)
        else:
            graph.node.remove(node)
    for init in [i for i in graph.initializer if i.name not in needed]:
        graph.initializer.remove(init)
    return proto
