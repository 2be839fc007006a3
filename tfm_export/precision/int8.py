"""fp32 graph -> int8 graph: explicit Q/DQ (static) or run-time activation quantization (dynamic).

Static graphs are what TensorRT's explicit quantization and ONNX Runtime's int8 kernels both take:
symmetric int8, zero point 0, per-output-channel weights, and only MatMul/Gemm quantized, so
LayerNormalization, Softmax, the residual Adds and the logits tensor stay in float. Embedding
tables are stored int8 too (per vocabulary row, the same scales the tied output projection uses): the
tables are ~40% of a base model's bytes, and an int8 artifact that kept them float would be under 2x
smaller. Dynamic graphs (ONNX Runtime only) gather int8 rows and dequantize just those; static graphs
gather from DequantizeLinear(table), since TensorRT lets only Q/DQ touch int8 tensors.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)

from ..artifacts.model_dir import EMBEDDING_MIN_ELEMENTS
from ..core.errors import TfmExportError, first_line
from ..core.graph_spec import LOGITS
from ..graphs.onnx_io import only_gathers, share_tied_weights
from ..graphs.roles import role_groups
from ..graphs.weights import gather_from_transposed

QUANTIZED_OPS = ("MatMul", "Gemm")
_BLOCK_ROWS = 256  # rows of a weight quantized at a time
QUANTIZER_EXTERNAL_BYTES = 1 << 30  # a graph's weights the quantizers get (and give back) as external data
FLOAT_OPS = ("LayerNormalization", "Softmax", "Add")  # reported as kept in float
log = logging.getLogger(__name__)


class _Feeds(CalibrationDataReader):
    def __init__(self, feeds: Iterable[dict[str, np.ndarray]]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


@contextlib.contextmanager
def _quiet_onnxruntime_quantizer() -> Iterator[None]:
    """The quantizer logs a 'consider pre-processing' warning through the root logger on every call;
    the exported graphs are already shape-inferred and optimised, so it is noise here."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _roundtrip(proto: onnx.ModelProto, quantize) -> onnx.ModelProto:
    """ONNX Runtime's quantizers read and write files: `proto` is saved (its weights in an external file past
    protobuf's 2 GB, as the quantizer then reads and writes them too) and emptied, so that a large graph is not in
    memory twice while the quantizer holds its own copy. quantize(source, target, external)."""
    large = sum(len(init.raw_data) for init in proto.graph.initializer) >= QUANTIZER_EXTERNAL_BYTES
    with tempfile.TemporaryDirectory(prefix="tfm-int8-") as tmp, _quiet_onnxruntime_quantizer():
        source, target = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save_model(proto, source, save_as_external_data=large, all_tensors_to_one_file=True,
                        location="fp32.onnx.data", size_threshold=1024)
        proto.Clear()
        try:
            quantize(str(source), str(target), large)
        except Exception as exc:  # the quantizers raise plain ValueError/RuntimeError/onnx errors
            raise TfmExportError(f"ONNX Runtime's quantizer failed: {first_line(exc)}") from None
        return onnx.load_model(str(target))


def logits_nodes(proto: onnx.ModelProto) -> list[str]:
    """The MatMul that makes the logits (and nothing else): kept in float by static quantization."""
    producers = {out: node for node in proto.graph.node for out in node.output}
    node = producers.get(LOGITS)
    while node is not None and node.op_type not in QUANTIZED_OPS:
        node = producers.get(node.input[0])
    return [node.name] if node is not None else []


def quantize_static_graph(proto: onnx.ModelProto, feeds: Iterable[dict[str, np.ndarray]],
                          int8_embeddings: bool = True) -> onnx.ModelProto:
    """Q/DQ graph with activation ranges from `feeds` (the graph's inputs recorded while decoding). The
    logits projection reads the float hidden state (its weight is stored int8 and dequantized, unless
    int8_embeddings is off: then the tables it shares with the embeddings stay float)."""
    proto = fold_weight_transposes(proto)
    excluded = logits_nodes(proto)

    def run(source: str, target: str, external: bool) -> None:
        quantize_static(source, target, _Feeds(feeds), quant_format=QuantFormat.QDQ, use_external_data_format=external,
                        op_types_to_quantize=list(QUANTIZED_OPS), per_channel=True, nodes_to_exclude=excluded,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax,
                        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True,
                                       "QDQOpTypePerChannelSupportToAxis": {"MatMul": 1},
                                       # MatMul outputs (the logits, what the residual Adds take) stay float
                                       "OpTypesToExcludeOutputQuantization": list(QUANTIZED_OPS),
                                       # Q/DQ only on the path into each MatMul; other readers keep the float
                                       "DedicatedQDQPair": True})
    quantized = _float_inputs_for_float_ops(_roundtrip(proto, run))
    return quantize_embeddings(quantized, gather_int8=False) if int8_embeddings else quantized


def _float_inputs_for_float_ops(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The quantizer routes every reader of a quantized tensor through its DequantizeLinear, so a residual
    Add would add an int8-rounded copy of the LayerNorm output (and DeepNorm's alpha * x would scale one).
    Every op but the quantized ones reads the float tensor again."""
    producers = {out: node for node in proto.graph.node for out in node.output}
    for node in proto.graph.node:
        if node.op_type in (*QUANTIZED_OPS, "Gather", "QuantizeLinear", "DequantizeLinear"):
            continue
        for j, name in enumerate(node.input):
            dq = producers.get(name)
            q = producers.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is not None and q.op_type == "QuantizeLinear":
                node.input[j] = q.input[0]
    _drop_unused(proto.graph)
    return proto


def quantize_dynamic_graph(proto: onnx.ModelProto, int8_embeddings: bool = True,
                           keep_embedding: bool = False) -> onnx.ModelProto:
    """Weights int8 per output channel; activations quantized per call by ONNX Runtime (CPU).
    keep_embedding: a tied table's Gathers keep reading the table itself (int8 per row, as the encoder stores
    it: the same tensor, so the two sessions can share it), and the projection its own W^T, which ONNX Runtime
    prepacks and then frees; otherwise both read W^T, which the Gathers keep alive beside its packed copy."""
    quantized = quantize_matmuls_dynamic(fold_weight_transposes(proto, tied=not keep_embedding))
    return fold_output_scales(quantize_embeddings(quantized) if int8_embeddings else quantized)


def quantize_matmuls_dynamic(proto: onnx.ModelProto) -> onnx.ModelProto:
    """onnxruntime.quantization.quantize_dynamic(op_types_to_quantize=["MatMul"], per_channel=True,
    weight_type=QInt8), done in place and a weight at a time: the same nodes and names (DynamicQuantizeLinear ->
    MatMulInteger -> Cast -> Mul by the two scales) and the same numbers, for every MatMul whose B is a float
    matrix. The library quantizes a weight's channels one by one in Python, saves and reloads the whole graph
    twice for shape inference, and holds it two or three times over: at NLLB-600M half its 385 s and 12 GB."""
    graph = proto.graph
    inits = {init.name: init for init in graph.initializer}
    readers = Counter(name for node in graph.node for name in node.input)
    activations: dict[str, tuple[str, str, str]] = {}
    weights: dict[str, tuple[str, str, str]] = {}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None or weight.data_type != onnx.TensorProto.FLOAT or len(weight.dims) != 2:
            nodes.append(node)
            continue
        if node.input[0] not in activations:
            activations[node.input[0]] = _quantize_activation(node.input[0], nodes)
        if weight.name not in weights:
            weights[weight.name] = _quantize_columns(graph, weight)
        nodes += _matmul_integer(node, activations[node.input[0]], weights[weight.name])
        readers[weight.name] -= 1
        if not readers[weight.name]:
            graph.initializer.remove(weight)
    del graph.node[:]
    graph.node.extend(nodes)
    return proto


def _quantize_activation(name: str, nodes: list[onnx.NodeProto]) -> tuple[str, str, str]:
    outputs = (f"{name}_quantized", f"{name}_scale", f"{name}_zero_point")
    nodes.append(helper.make_node("DynamicQuantizeLinear", [name], list(outputs), f"{name}_QuantizeLinear"))
    return outputs


def _quantize_columns(graph: onnx.GraphProto, init: onnx.TensorProto) -> tuple[str, str, str]:
    """Symmetric int8 with one scale per column (output channel), in ONNX Runtime's arithmetic: the range
    widened to hold 0, its float64 width over 254 stored as float32 (1.0 where that is below float32's tiny),
    values divided in float32, rounded half to even and clipped to [-128, 127]."""
    weight = numpy_helper.to_array(init)
    absmax = np.maximum(np.abs(np.minimum(weight.min(axis=0), 0)), np.abs(np.maximum(weight.max(axis=0), 0)))
    width = 2 * absmax.astype(np.float64) / 254.0
    scale = np.where(width < np.finfo(np.float32).tiny, 1.0, width).astype(np.float32)
    quantized = np.empty(weight.shape, np.int8)
    for start in range(0, len(weight), _BLOCK_ROWS):  # float temporaries of a block, not of a whole table
        rows = slice(start, start + _BLOCK_ROWS)
        quantized[rows] = np.clip((weight[rows] / scale).round(), -128, 127)
    del weight
    names = (f"{init.name}_quantized", f"{init.name}_zero_point", f"{init.name}_scale")
    graph.initializer.extend([numpy_helper.from_array(scale, names[2]),
                              numpy_helper.from_array(np.zeros(scale.shape, np.int8), names[1]),
                              numpy_helper.from_array(quantized, names[0])])
    return names


def _matmul_integer(node: onnx.NodeProto, activation: tuple[str, str, str],
                    weight: tuple[str, str, str]) -> list[onnx.NodeProto]:
    name, out = f"{node.name}_quant", node.output[0]
    integer, floats, scales = f"{out}_output_quantized", f"{out}_output_quantized_cast_output", f"{name}_scales_mul"
    return [helper.make_node("MatMulInteger", [activation[0], weight[0], activation[2], weight[1]], [integer], name),
            helper.make_node("Cast", [integer], [floats], f"{integer}_cast", to=onnx.TensorProto.FLOAT),
            helper.make_node("Mul", [activation[1], weight[2]], [f"{scales}:0"], scales),
            helper.make_node("Mul", [floats, f"{scales}:0"], [out], f"{name}_output_scale_mul")]


def fold_output_scales(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A constant scalar multiplying a dynamically quantized MatMul's output (the tied projection's
    d_model ** -0.5) joins the weight's per-channel scales (a copy: a tied table's scales also serve its
    Gather). ONNX Runtime then computes the logits in one fused op instead of writing an (N, V) tensor and
    scaling it into a second one: 16 MB less at beam 4 x 32 on a 32,000-token vocabulary."""
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    readers = Counter(name for node in graph.node for name in node.input)
    for node in [n for n in graph.node if n.op_type == "Mul" and n.input[1] in inits]:
        scalar, scaled = numpy_helper.to_array(inits[node.input[1]]), producers.get(node.input[0])
        if scalar.size != 1 or scaled is None or scaled.op_type != "Mul" or readers[node.input[0]] != 1:
            continue
        cast, scales = producers.get(scaled.input[0]), producers.get(scaled.input[1])
        if cast is None or cast.op_type != "Cast" or producers.get(cast.input[0], cast).op_type != "MatMulInteger" \
                or scales is None or scales.op_type != "Mul" or scales.input[1] not in inits \
                or readers[scaled.input[1]] != 1:
            continue
        weight_scale = inits[scales.input[1]]
        folded = numpy_helper.from_array(numpy_helper.to_array(weight_scale) * scalar.reshape(()),
                                         f"{weight_scale.name}_times_{node.input[1]}")
        graph.initializer.append(folded)
        scales.input[1], scaled.output[0] = folded.name, node.output[0]
        graph.node.remove(node)
    _drop_unused(graph)
    return proto


def float_ops(proto: onnx.ModelProto) -> dict[str, int]:
    """What still computes in float: the design's high-precision ops, the static logits projection (float
    activations, int8 weights) and MatMuls left unquantized (dynamic mode's attention products)."""
    producers = {out: node.op_type for node in proto.graph.node for out in node.output}
    counts: Counter[str] = Counter()
    for node in proto.graph.node:
        dequantized = [producers.get(i) == "DequantizeLinear" for i in node.input]
        if node.op_type in FLOAT_OPS:
            counts[node.op_type] += 1
        elif node.op_type in QUANTIZED_OPS and not all(dequantized):
            kind = "float activations, int8 weights" if any(dequantized) else "float"
            counts[f"{node.op_type} ({kind})"] += 1
        elif node.op_type == "Gather" and node.name.endswith("_int8"):
            counts["Gather (int8 table, float rows)"] += 1
        elif node.op_type == "Gather" and dequantized[0]:
            counts["Gather (dequantized int8 table)"] += 1
    counts.update(group.role for group in role_groups(proto.graph))  # RMSNorm, RoPE, relative bias: float ops
    return dict(sorted(counts.items()))


def fold_weight_transposes(proto: onnx.ModelProto, tied: bool = True) -> onnx.ModelProto:
    """Transpose(W) of a constant weight becomes a stored W^T, so the quantizers see a constant MatMul
    weight; a tied embedding then reads W^T too (share_tied_weights), keeping one copy to quantize, unless
    `tied` is off."""
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    readers = Counter(name for node in graph.node for name in node.input)
    tied_here = False
    for node in [n for n in graph.node if n.op_type == "Transpose" and n.input[0] in inits]:
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        graph.initializer.append(_transposed(inits[node.input[0]], perm, node.output[0]))
        graph.node.remove(node)
        readers[node.input[0]] -= 1
        if tied and only_gathers(graph, node.input[0]):  # a tied table: its Gathers read W^T, known equal
            gather_from_transposed(graph, node.input[0], node.output[0])
            readers[node.input[0]], tied_here = 0, True
        if not readers[node.input[0]]:  # W^T alone from now on: a graph of gigabytes is not held twice
            graph.initializer.remove(inits.pop(node.input[0]))
    if tied and not tied_here:  # a graph exported with W^T stored beside W: found by value
        share_tied_weights(proto)
    return proto


def _transposed(init: onnx.TensorProto, perm: list[int] | None, name: str) -> onnx.TensorProto:
    """The transposed tensor, with at most two copies of a table alive at a time (not the four of from_array)."""
    values = np.ascontiguousarray(np.transpose(numpy_helper.to_array(init), perm))
    tensor = onnx.TensorProto(name=name, data_type=init.data_type, dims=values.shape)
    raw = values.tobytes()
    del values
    tensor.raw_data = raw
    return tensor


def quantize_embeddings(proto: onnx.ModelProto, gather_int8: bool = True) -> onnx.ModelProto:
    """Store each large float Gather table as int8 with one scale per gathered row; see the module doc.
    A table the quantizer already made int8 (a tied projection's weight) is reused, not stored twice.
    gather_int8: gather the int8 rows and dequantize only those (ONNX Runtime's CPU kernels); else the
    Gather reads DequantizeLinear(table), because TensorRT's int8 is a quantized type only Q/DQ touch."""
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    for node in [n for n in graph.node if n.op_type == "Gather"]:
        table, axis, dq = node.input[0], _gather_axis(node), producers.get(node.input[0])
        if dq is not None and dq.op_type == "DequantizeLinear":
            names = _dequantized_rows(dq, inits, axis) if gather_int8 else None
        elif table in inits and inits[table].data_type == onnx.TensorProto.FLOAT and len(inits[table].dims) == 2 \
                and np.prod(inits[table].dims) >= EMBEDDING_MIN_ELEMENTS:
            names = _quantize_table(graph, inits.pop(table), axis, dequantize_for_gathers=not gather_int8)
            names = names if gather_int8 else None
        else:
            continue
        if names:
            _gather_then_dequantize(graph, node, *names, axis)
    _drop_unused(graph)
    return proto


def _dequantized_rows(dq: onnx.NodeProto, inits: dict[str, onnx.TensorProto], axis: int) -> tuple[str, str] | None:
    """The int8 table and scales behind DQ(W_int8) when its scales run along the gathered axis."""
    table, scale = (inits.get(name) for name in dq.input[:2])
    zero = inits.get(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    if table is None or scale is None or len(table.dims) != 2 or list(scale.dims) != [table.dims[axis]] \
            or _gather_axis(dq) != axis or (zero is not None and numpy_helper.to_array(zero).any()):
        return None
    return table.name, scale.name


def _quantize_table(graph: onnx.GraphProto, init: onnx.TensorProto, axis: int,
                    dequantize_for_gathers: bool = False) -> tuple[str, str]:
    """int8 storage for a float table: ONNX Runtime's copy if it made one, else our own; users other
    than Gathers (a tied projection left in float), and Gathers too if asked, read it through a
    DequantizeLinear."""
    names = _existing_quantization(graph, init.name, init.dims[axis]) or _quantize_rows(graph, init, axis)
    graph.initializer.remove(init)
    if any(init.name in n.input and (dequantize_for_gathers or not (n.op_type == "Gather" and
                                                                    n.input[0] == init.name)) for n in graph.node):
        graph.node.insert(0, helper.make_node("DequantizeLinear", list(names), [init.name], axis=axis,
                                              name=f"{init.name}_dequantize"))
    return names


def _drop_unused(graph: onnx.GraphProto) -> None:
    """Q/DQ nodes (and initializers) nobody reads any more after a rewrite."""
    while True:
        used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                and n.output[0] not in used]
        for node in dead:
            graph.node.remove(node)
        unused = [i for i in graph.initializer if i.name not in used] if not dead else []
        for init in unused:
            graph.initializer.remove(init)
        if not dead:
            return


def _existing_quantization(graph: onnx.GraphProto, name: str, rows: int) -> tuple[str, str] | None:
    """ONNX Runtime's int8 copy of `name` (`<name>_quantized`, `_scale`, zero points 0), if it made one."""
    inits = {i.name: i for i in graph.initializer}
    quantized, scale, zero = (inits.get(f"{name}_{suffix}") for suffix in ("quantized", "scale", "zero_point"))
    if quantized is None or scale is None or quantized.data_type != onnx.TensorProto.INT8 \
            or list(scale.dims) != [rows] or (zero is not None and numpy_helper.to_array(zero).any()):
        return None
    return quantized.name, scale.name


def _quantize_rows(graph: onnx.GraphProto, init: onnx.TensorProto, axis: int) -> tuple[str, str]:
    """Symmetric int8 with one scale per index along the gathered axis."""
    weight = numpy_helper.to_array(init)
    blocks = [slice(start, start + _BLOCK_ROWS) for start in range(0, len(weight), _BLOCK_ROWS)]
    if axis == 0:
        scale = np.concatenate([np.abs(weight[rows]).max(axis=1) for rows in blocks]) / 127.0
    else:
        scale = functools.reduce(np.maximum, (np.abs(weight[rows]).max(axis=0) for rows in blocks)) / 127.0
    scale[scale == 0] = 1.0
    quantized = np.empty(weight.shape, np.int8)
    for rows in blocks:
        quantized[rows] = np.clip(np.rint(weight[rows] / np.expand_dims(scale[rows] if axis == 0 else scale, 1 - axis)),
                                  -127, 127)
    del weight
    names = f"{init.name}_int8", f"{init.name}_row_scale"
    graph.initializer.extend([numpy_helper.from_array(quantized, names[0]),
                              numpy_helper.from_array(scale.astype(np.float32), names[1])])
    return names


def _gather_axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def _gather_then_dequantize(graph: onnx.GraphProto, node: onnx.NodeProto, table: str, scale: str,
                            axis: int) -> None:
    """Gather(W, ids) -> Cast(Gather(W_int8, ids)) * Gather(scale, ids), the scales on a new axis
    (last for axis 0, whose result is (*ids, C); first for axis 1, whose result is (C, *ids))."""
    out, ids, base = node.output[0], node.input[1], node.name
    axes = f"{out}_scale_axes"
    graph.initializer.append(numpy_helper.from_array(np.array([-1 if axis == 0 else 0], np.int64), axes))
    new = [helper.make_node("Gather", [table, ids], [f"{out}_int8"], axis=axis, name=f"{base}_int8"),
           helper.make_node("Cast", [f"{out}_int8"], [f"{out}_float"], to=onnx.TensorProto.FLOAT, name=f"{base}_cast"),
           helper.make_node("Gather", [scale, ids], [f"{out}_scale"], axis=0, name=f"{base}_scale"),
           helper.make_node("Unsqueeze", [f"{out}_scale", axes], [f"{out}_scale_b"], name=f"{base}_scale_axes"),
           helper.make_node("Mul", [f"{out}_float", f"{out}_scale_b"], [out], name=f"{base}_dequantize")]
    index = list(graph.node).index(node)
    graph.node.remove(node)
    for offset, item in enumerate(new):
        graph.node.insert(index + offset, item)
