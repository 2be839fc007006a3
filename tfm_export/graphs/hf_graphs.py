"""The graphs Hugging Face's runtimes load, derived from a directory's encoder.onnx and decoder_step.onnx by graph
rewrites (any precision: what a quantizer made of a projection is carried over as it is, never recomputed).

transformers.js and Optimum feed the decoder the encoder's `last_hidden_state` (`encoder_hidden_states`) and a past
that is empty at the first step; our decoder_step takes the cross-attention keys and values instead. The merged
decoder computes them itself with no If node: it projects the rows of `encoder_hidden_states` the past does not hold
yet (all of them at the first step, none later) with the encoder graph's own projection nodes, and concatenates
them after the past's. Optimum's pair is the same graph with an empty past built in (`decoder_model.onnx`) and the
contract's decoder_step as it is (`decoder_with_past_model.onnx`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..core.config import ModelConfig
from ..core.errors import TfmExportError
from ..core.graph_spec import LAST_HIDDEN_STATE, cache_names

ENCODER_HIDDEN_STATES = "encoder_hidden_states"  # the merged decoder's input: the encoder's last_hidden_state
PAST_SRC_LEN = "past_encoder_sequence_length"  # the source positions a past's cross keys/values hold (0, then all)
_PREFIX = "cross_projection/"  # the encoder's projection nodes and constants, renamed apart in the decoder
_INT64_MAX = np.iinfo(np.int64).max


class HfGraphError(TfmExportError):
    """A graph the rewrite cannot carry over."""


def encoder_model(encoder: onnx.ModelProto) -> onnx.ModelProto:
    """The encoder with `last_hidden_state` its only output: the merged decoder computes the cross keys and values,
    so nothing is computed twice."""
    model = _copy(encoder)
    keep = [o for o in model.graph.output if o.name == LAST_HIDDEN_STATE]
    del model.graph.output[:]
    model.graph.output.extend(keep)
    _prune(model.graph)
    return model


def merged_decoder(encoder: onnx.ModelProto, decoder: onnx.ModelProto, cfg: ModelConfig) -> onnx.ModelProto:
    """decoder_model_merged.onnx: decoder_step's inputs with `encoder_hidden_states` beside them, its outputs with
    each layer's cross keys and values (`present.{i}.encoder.*`) after them."""
    names = cache_names(cfg)
    nodes, inits = _projection(encoder, names.cross_outputs)
    model = _copy(decoder)
    graph = model.graph
    outputs = {o.name: o for o in encoder.graph.output}
    hidden = _copy_value(outputs[LAST_HIDDEN_STATE])
    hidden.name = ENCODER_HIDDEN_STATES
    graph.input.insert(2, hidden)
    for value in graph.input:
        if value.name in names.cross_inputs:
            value.type.tensor_type.shape.dim[2].dim_param = PAST_SRC_LEN
    taken = {i.name for i in graph.initializer}
    clashes = [i.name for i in inits if i.name in taken]
    if clashes:
        raise HfGraphError(f"the encoder's and the decoder's graphs both hold a tensor named {clashes[0]}; export the "
                           "model again")
    new_rows = _PREFIX + "new_rows"
    graph.initializer.extend([*inits, numpy_helper.from_array(np.array([2], np.int64), _PREFIX + "axis2"),
                              numpy_helper.from_array(np.array([3], np.int64), _PREFIX + "axis3"),
                              numpy_helper.from_array(np.array([_INT64_MAX], np.int64), _PREFIX + "end"),
                              numpy_helper.from_array(np.array([1], np.int64), _PREFIX + "axis1")])
    added = [helper.make_node("Shape", [names.cross_inputs[0]], [_PREFIX + "past_shape"]),
             helper.make_node("Slice", [_PREFIX + "past_shape", _PREFIX + "axis2", _PREFIX + "axis3"],
                              [_PREFIX + "held"]),
             helper.make_node("Slice", [ENCODER_HIDDEN_STATES, _PREFIX + "held", _PREFIX + "end",
                                        _PREFIX + "axis1"], [new_rows])]
    sources = {i.name for i in encoder.graph.input} - {i.name for i in encoder.graph.initializer}
    added += [_renamed(node, new_rows, sources) for node in nodes]
    for past, present in zip(names.cross_inputs, names.cross_outputs, strict=True):
        added.append(helper.make_node("Concat", [past, _PREFIX + present], [present], axis=2))
        graph.output.append(_copy_value(outputs[present]))
    _rewire(graph, dict(zip(names.cross_inputs, names.cross_outputs, strict=True)))
    _prepend(graph, added)  # already in order: they read inputs, constants and each other (the encoder's order)
    _prune(graph)
    return model


def first_step_decoder(merged: onnx.ModelProto, cfg: ModelConfig) -> onnx.ModelProto:
    """decoder_model.onnx: the merged decoder with an empty past of its own (Optimum's decoder without past)."""
    model = _copy(merged)
    graph = model.graph
    names = cache_names(cfg)
    past = {v.name: v for v in graph.input if v.name in (*names.self_inputs, *names.cross_inputs)}
    batch = _PREFIX + "batch"
    added = [helper.make_node("Shape", [graph.input[0].name], [batch], start=0, end=1)]
    for name, value in past.items():
        dims = value.type.tensor_type.shape.dim
        rest = numpy_helper.from_array(np.array([dims[1].dim_value, 0, dims[3].dim_value], np.int64),
                                       f"{_PREFIX}{name}/rest")
        graph.initializer.append(rest)
        added += [helper.make_node("Concat", [batch, rest.name], [f"{_PREFIX}{name}/shape"], axis=0),
                  helper.make_node("ConstantOfShape", [f"{_PREFIX}{name}/shape"], [name],
                                   value=helper.make_tensor("zero", value.type.tensor_type.elem_type, [1], [0]))]
        graph.input.remove(value)
    _prepend(graph, added)
    _prune(graph)
    return model


def with_past_decoder(decoder: onnx.ModelProto) -> onnx.ModelProto:
    """decoder_with_past_model.onnx: the contract's decoder_step as it is, less constants nothing reads (runtimes
    warn of each one when they open the graph)."""
    model = _copy(decoder)
    _prune(model.graph)
    return model


def _projection(encoder: onnx.ModelProto, outputs: tuple[str, ...]
                ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The encoder's nodes from `last_hidden_state` to the cross keys and values, with the constants they read.
    The source's (batch, length) may be read off its ids or mask by a Shape: those rows' (batch, length)."""
    nodes = list(encoder.graph.node)
    producer = {out: index for index, node in enumerate(nodes) for out in node.output}
    inits = {i.name: i for i in encoder.graph.initializer}
    sources = {i.name for i in encoder.graph.input} - set(inits)
    wanted, used = list(outputs), set()
    while wanted:
        name = wanted.pop()
        if name in producer and name != LAST_HIDDEN_STATE and producer[name] not in used:
            used.add(producer[name])
            wanted.extend(nodes[producer[name]].input)
    chosen = [nodes[index] for index in sorted(used)]  # the encoder's order, which is topological
    for node in chosen:
        if node.op_type != "Shape" and sources & set(node.input):
            raise HfGraphError(f"the encoder's cross-attention keys and values read its {node.input[0]} (a "
                               f"{node.op_type} node), not only its {LAST_HIDDEN_STATE}; this graph cannot be merged")
    read = {i for n in chosen for i in n.input}
    return chosen, [_renamed_tensor(inits[name]) for name in sorted(read & set(inits))]


def _renamed(node: onnx.NodeProto, rows: str, sources: set[str]) -> onnx.NodeProto:
    """The node apart from the decoder's, reading `rows` for last_hidden_state; a Shape of the source's ids or
    mask reads the rows' first two axes, the same (batch, length)."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.name = _PREFIX + node.name if node.name else ""
    for i, name in enumerate(copy.input):
        if name:
            copy.input[i] = rows if name == LAST_HIDDEN_STATE or name in sources else _PREFIX + name
    if node.op_type == "Shape" and sources & set(node.input):
        attrs = {a.name: a.i for a in node.attribute}
        if attrs.get("end", 2) > 2 or attrs.get("end", 2) < -1 or attrs.get("start", 0) < 0:
            raise HfGraphError("the encoder's cross-attention projection reads an unexpected part of its source's "
                               "shape; this graph cannot be merged")
        del copy.attribute[:]
        copy.attribute.extend([helper.make_attribute("start", attrs.get("start", 0)),
                               helper.make_attribute("end", 1 if attrs.get("end", 2) == -1 else attrs.get("end", 2))])
    for i, name in enumerate(copy.output):
        copy.output[i] = _PREFIX + name
    return copy


def _renamed_tensor(tensor: onnx.TensorProto) -> onnx.TensorProto:
    copy = TensorProto()
    copy.CopyFrom(tensor)
    copy.name = _PREFIX + tensor.name
    return copy


def _rewire(graph: onnx.GraphProto, renames: dict[str, str]) -> None:
    """Every node reads renames[name] where it read name."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = renames.get(name, name)


def _prepend(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    kept = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes, *kept])


def _prune(graph: onnx.GraphProto) -> None:
    """Drops the nodes and constants no output reads."""
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    inits = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    values = [v for v in graph.value_info if v.name in needed]
    del graph.value_info[:]
    graph.value_info.extend(values)


def _copy_value(value: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value)
    return copy


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy

