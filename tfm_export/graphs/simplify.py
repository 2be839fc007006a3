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


def simplify(proto: onnx.ModelProto) -> onnx.ModelProto:
    proto = merge_sibling_matmuls(proto)
    return drop_identity_reshapes(proto)


def _shapes(proto: onnx.ModelProto) -> dict[str, list[int | str]]:
    """Every value's inferred shape: sizes, or the axis symbols of dynamic ones."""
    inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    values = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    return {v.name: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim]
            for v in values if v.type.tensor_type.HasField("shape")}


def _known(shape: list[int | str] | None) -> bool:
    return shape is not None and all(d != 0 and d != "" for d in shape)


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


def merge_sibling_matmuls(proto: onnx.ModelProto) -> onnx.ModelProto:
    graph = proto.graph
    weights = {i.name: i for i in graph.initializer if len(i.dims) == 2}
    by_input: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights:
            by_input.setdefault(node.input[0], []).append(node)
    for source, nodes in by_input.items():
        arrays = [numpy_helper.to_array(weights[n.input[1]]) for n in nodes]
        if len(nodes) < 2 or len({a.shape[0] for a in arrays}) > 1 or len({a.dtype for a in arrays}) > 1:
            continue
        merged = f"{nodes[0].output[0]}__merged"
        graph.initializer.append(numpy_helper.from_array(np.concatenate(arrays, axis=1), f"{merged}_weight"))
        widths = numpy_helper.from_array(np.array([a.shape[1] for a in arrays], np.int64), f"{merged}_widths")
        graph.initializer.append(widths)
        first = list(graph.node).index(nodes[0])
        graph.node.insert(first, helper.make_node("Split", [merged, widths.name], [n.output[0] for n in nodes],
                                                  axis=-1, name=f"{merged}_split"))
        graph.node.insert(first, helper.make_node("MatMul", [source, f"{merged}_weight"], [merged], name=merged))
        for node in nodes:
            graph.node.remove(node)
    return _without_unread(proto)


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
