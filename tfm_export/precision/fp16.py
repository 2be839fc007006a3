"""fp32 graph -> fp16 graph, with the ops that overflow or lose too much in fp16 kept in fp32.

LayerNormalization (its variance), Softmax (its sum), the residual Adds in front of each LayerNorm
(the post-norm residual stream grows layer by layer) and the logits projection stay fp32, as the
README's precision section fixes; so do the variants' RMSNorm (its mean of squares), RoPE rotations and
relative position bias, found by graphs.roles; everything else, weights included, is fp16. ONNX Runtime's
converter inserts the Casts at the boundaries and clamps weights into fp16's finite range.
"""

from __future__ import annotations

import copy
from collections import Counter

import onnx
from onnxruntime.transformers.float16 import convert_float_to_float16
from onnxruntime.transformers.onnx_model import OnnxModel

from ..core.graph_spec import ATTENTION_MASK, ENCODER_ATTENTION_MASK, INPUT_IDS, LOGITS, TOKEN_BIAS, TOP_LOGPROBS
from ..graphs.roles import role_nodes

FP32_OPS = ("LayerNormalization", "Softmax")
FP16_MAX = 65504.0  # weights beyond +-this become +-FP16_MAX, not inf
FP16_MIN_POSITIVE = 5.96e-8  # smallest fp16 subnormal; smaller magnitudes would flush to zero anyway
ALWAYS_FP32_IO = (LOGITS, INPUT_IDS, ATTENTION_MASK, ENCODER_ATTENTION_MASK, TOKEN_BIAS, TOP_LOGPROBS)


def fp32_nodes(proto: onnx.ModelProto) -> dict[str, str]:
    """Node name -> why it stays fp32, for the nodes found by role rather than op type."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    producers = {out: node for node in proto.graph.node for out in node.output}
    for node in proto.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    roles = role_nodes(proto.graph)
    keep = {n.name: f"{n.op_type} ({roles[n.name]})" for n in proto.graph.node if n.name in roles}
    keep.update({n.name: "Add (residual)" for n in proto.graph.node if n.op_type == "Add" and n.name not in roles and
                 any(c.op_type == "LayerNormalization" or (c.op_type == "Pow" and roles.get(c.name) == "RMSNorm")
                     for c in consumers.get(n.output[0], []))})
    node = producers.get(LOGITS)
    while node is not None and node.op_type != "MatMul":  # the projection and the scale/reshape after it
        keep[node.name] = f"{node.op_type} (logits)"
        node = producers.get(node.input[0])
    if node is not None:
        keep[node.name] = "MatMul (logits)"
        keep.update({n.name: f"{n.op_type} (search)" for n in _downstream(node, consumers) if n.name not in keep})
    return keep


def _downstream(node: onnx.NodeProto, consumers: dict[str, list[onnx.NodeProto]]) -> list[onnx.NodeProto]:
    """Every node that reads what `node` computes, directly or not: after the logits, decoder_step_search's
    log-softmax, decoding rules and TopK, which rank candidates by float32 log-probabilities."""
    found, todo = {}, [node]
    while todo:
        for reader in [c for out in todo.pop().output for c in consumers.get(out, [])]:
            if reader.name not in found:
                found[reader.name] = reader
                todo.append(reader)
    return list(found.values())


def _unshare_fp32_initializers(proto: onnx.ModelProto, fp32_names: set[str]) -> onnx.ModelProto:
    """A copy where each initializer read by an fp32-kept node has that node as its only reader. The
    converter names the Cast it puts in front of such a node after the initializer, so an initializer
    shared by several (the identical LayerNorm weights of an untrained model) broke SSA form."""
    proto = copy.deepcopy(proto)
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    readers = Counter(name for node in graph.node for name in set(node.input) if name in inits)
    for node in graph.node:
        if node.op_type not in FP32_OPS and node.name not in fp32_names:
            continue
        for j, name in enumerate(node.input):
            if readers.get(name, 0) > 1:
                copy_ = onnx.TensorProto()
                copy_.CopyFrom(inits[name])
                copy_.name = f"{name}__{node.name}"
                if copy_.name in node.input:  # read twice by this node (a Slice's equal starts and ends)
                    copy_.name += f"__{j}"
                graph.initializer.append(copy_)
                node.input[j] = copy_.name
                readers[name] -= 1
    return proto


def _drop_round_trips(proto: onnx.ModelProto) -> None:
    """The converter casts an fp32 node's output to fp16 and back to fp32 before an fp32 reader (a
    residual Add into its LayerNorm, the logits into the graph output), which rounds exactly what was
    kept fp32. Such readers take the fp32 tensor itself; a Cast left unread is removed."""
    graph = proto.graph
    producers = {out: node for node in graph.node for out in node.output}
    fp32 = _fp32_tensors(proto)
    for node in graph.node:
        inner = producers.get(node.input[0]) if node.op_type == "Cast" else None
        if _cast_to(node) == onnx.TensorProto.FLOAT and inner is not None and inner.op_type == "Cast" \
                and _cast_to(inner) == onnx.TensorProto.FLOAT16 and inner.input[0] in fp32:
            node.input[0] = inner.input[0]  # Cast(float -> float) is a copy; it keeps the output's name
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    for node in [n for n in graph.node if n.op_type == "Cast" and n.output[0] not in read]:
        graph.node.remove(node)


def _cast_to(node: onnx.NodeProto) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _fp32_tensors(proto: onnx.ModelProto) -> set[str]:
    inferred = onnx.shape_inference.infer_shapes(proto)
    values = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    return {v.name for v in values if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}


def to_fp16(proto: onnx.ModelProto, keep_io_types: bool) -> tuple[onnx.ModelProto, dict[str, int]]:
    """The fp16 graph and what stayed fp32 (op role -> count). Without keep_io_types the cache and
    hidden-state tensors are fp16 (half the memory and traffic); ids, masks and logits never change."""
    roles = fp32_nodes(proto)
    proto = _unshare_fp32_initializers(proto, set(roles))
    names = [v.name for v in [*proto.graph.input, *proto.graph.output]]
    keep_io = True if keep_io_types else [n for n in names if n in ALWAYS_FP32_IO]
    converted = convert_float_to_float16(proto, keep_io_types=keep_io, op_block_list=list(FP32_OPS),
                                         node_block_list=list(roles), max_finite_val=FP16_MAX,
                                         min_positive_val=FP16_MIN_POSITIVE)
    del converted.graph.value_info[:]  # float32 shapes of the source; the checker infers them again
    OnnxModel(converted).topological_sort()  # the converter appends its Casts after their users
    _drop_round_trips(converted)
    kept = Counter(roles.values())
    kept.update(n.op_type for n in proto.graph.node if n.op_type in FP32_OPS)
    return converted, dict(sorted(kept.items()))
