"""A static TensorRT-compatibility report of a model directory's graphs, on any machine.

Reads the graphs only (no TensorRT, no GPU): operators against the ONNX parser's supported list for
each release in trt_parser_ops, the opset, tensor types, the parser's documented restrictions that
these graphs could trip (symmetric Q/DQ, constant axes, boolean logic ops, integer Pow), and the
graph contract's own rules for engines: no If/Loop/Scan, every dynamic axis named as the spec names
it (so the decoder's past length gets a profile range starting at 0, the first step).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import numpy_helper

from ..artifacts.model_dir import ModelDir
from ..core.graph_spec import GraphSpec, tensorrt_specs
from ..graphs.onnx_io import load_graph
from .parser_ops import RELEASES, ParserRelease

CONTROL_FLOW = {"If", "Loop", "Scan"}
TOPK_MAX_K = 3840  # the largest K TensorRT's TopK takes
LOGIC_OPS = {"Not", "And", "Or", "Xor"}
REDUCE_OPS = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}
INTEGER_TYPES = {onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.INT8, onnx.TensorProto.UINT8}
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
FLOAT_ONLY_OPS = {"MatMul", "Gemm", "Softmax", "LayerNormalization"}
# int8 is a quantized type in TensorRT: made by QuantizeLinear or stored as weights, read only by DequantizeLinear.
QUANTIZED_TYPES = {onnx.TensorProto.INT8}
RUNTIME_QUANTIZATION = dict.fromkeys(("DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"),
                                     " (int8 dynamic graphs are for ONNX Runtime; TensorRT needs --mode static)")
FLOAT, BOOL = onnx.TensorProto.FLOAT, onnx.TensorProto.BOOL  # what an input of unknown type is assumed to be


@dataclass(frozen=True)
class Finding:
    graph: str
    release: str  # a ParserRelease name, or "contract" for what every engine needs
    level: str  # "error": the parser or an engine would fail; "warning": works with a caveat
    message: str


@dataclass(frozen=True)
class CompatReport:
    model_dir: Path
    precision: str
    findings: tuple[Finding, ...]
    releases: tuple[str, ...]

    def errors(self, release: str | None = None) -> list[Finding]:
        return [f for f in self.findings if f.level == "error" and (release is None or f.release in (release,
                                                                                                      "contract"))]

    def lines(self) -> list[str]:
        out = [f"{self.model_dir}: {self.precision} graphs, static TensorRT compatibility (from the ONNX parsers' "
               "documented operators and rules; no builder ran for these releases)"]
        for release in self.releases:
            verdict = "compatible" if not self.errors(release) else f"{len(self.errors(release))} problem(s)"
            out.append(f"  {release}: {verdict}")
        out += [f"  {f.level}: {f.graph} ({f.release}): {f.message}" for f in self.findings]
        return out


class _Graph:
    """The facts about one graph that the checks read: types, constants, producers."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        inferred = onnx.shape_inference.infer_shapes(proto)
        graph = inferred.graph
        self.proto, self.nodes = inferred, list(graph.node)
        self.types = {v.name: v.type.tensor_type.elem_type
                      for v in [*graph.input, *graph.output, *graph.value_info]}
        self.types.update({i.name: i.data_type for i in graph.initializer})
        self.initializers = {i.name: i for i in graph.initializer}
        self.constants = set(self.initializers) | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
        self.readers = {name for n in graph.node for name in n.input} | {o.name for o in graph.output}
        self.opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def check_model_dir(model_dir: Path) -> CompatReport:
    directory = ModelDir.read(model_dir)
    directory.vocabulary()  # a directory that cannot translate is not ready for engines either
    specs = tensorrt_specs(directory.config, directory.graphs)
    findings = []
    for name in [g for g in directory.graphs if g not in {graph.value for graph in specs}]:
        directory.graph_path(name)  # not TensorRT's to check, but a damaged directory is refused
    for graph, spec in specs.items():
        findings += graph_findings(load_graph(directory, graph.value), spec)
    return CompatReport(model_dir, directory.precision, tuple(findings), tuple(r.name for r in RELEASES))


def graph_findings(proto: onnx.ModelProto, spec: GraphSpec) -> list[Finding]:
    """Findings per release; the same problem on many nodes is one finding with a count and an example."""
    facts, name = _Graph(proto), spec.graph.value
    found = [Finding(name, "contract", "error", m) for m in _contract_problems(facts, spec)]
    for release in RELEASES:
        nodes: dict[tuple[str, str], list[str]] = {}
        for level, message, node in _release_problems(facts, release):
            nodes.setdefault((level, message), []).append(node)
        for (level, message), names in nodes.items():
            where = "" if not names[0] else f" ({len(names)} node{'s' * (len(names) > 1)}, e.g. {names[0]!r})"
            found.append(Finding(name, release.name, level, message + where))
    return found


def _contract_problems(g: _Graph, spec: GraphSpec) -> Iterator[str]:
    try:
        onnx.checker.check_model(g.proto)
    except onnx.checker.ValidationError as exc:
        yield f"not a valid ONNX graph ({str(exc).splitlines()[0][:200]}); export it again"
    missing = [t.name for t in spec.outputs if t.name not in {o.name for o in g.proto.graph.output}]
    if missing:
        yield f"outputs {', '.join(missing[:3])} are missing; export it again with tfm-export"
    for node in g.nodes:
        if node.op_type in CONTROL_FLOW:
            yield f"{node.op_type} node {node.name!r}: control flow breaks the contract (TensorRT profiles, merged " \
                  "decoders); export again with tfm-export"
    inputs = {v.name: v for v in g.proto.graph.input}
    for tensor in spec.inputs:
        value = inputs.get(tensor.name)
        if value is None:
            yield f"input {tensor.name!r} is missing"
            continue
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        if [d if isinstance(d, int) else d.replace(" ", "") for d in dims] != \
                [d if isinstance(d, int) else d.replace(" ", "") for d in tensor.shape]:
            yield f"input {tensor.name!r} has axes {dims}, the contract says {list(tensor.shape)} (an unnamed or " \
                  "fixed axis cannot get an optimisation profile range)"


def _release_problems(g: _Graph, release: ParserRelease) -> Iterator[tuple[str, str, str]]:
    """(level, message, node name or '') for every problem."""
    low, high = release.opsets
    if not low <= g.opset <= high:
        yield "error", f"opset {g.opset} is outside the parser's {low}..{high}; export with --opset 17", ""
    for node in g.nodes:
        if node.domain not in ("", "ai.onnx"):
            yield "error", f"{node.domain}.{node.op_type} is not a standard ONNX op", node.name
        elif node.op_type not in release.ops:
            hint = RUNTIME_QUANTIZATION.get(node.op_type, "")
            yield "error", f"{node.op_type} is not supported by the ONNX parser{hint}", node.name
        else:
            yield from (("error", m, node.name) for m in _node_restrictions(g, node, release))
    yield from ((level, m, "") for level, m in _type_problems(g, release))


def _node_restrictions(g: _Graph, node: onnx.NodeProto, release: ParserRelease) -> Iterator[str]:
    op = node.op_type
    data = node.input[:2] if op == "QuantizeLinear" else node.input  # its zero point is int8 by design
    if op != "DequantizeLinear" and any(g.types.get(i) in QUANTIZED_TYPES for i in data):
        yield f"{op} reads an int8 tensor; TensorRT's int8 is a quantized type that only DequantizeLinear reads"
    if op == "Cast" and any(a.name == "to" and a.i in QUANTIZED_TYPES for a in node.attribute):
        yield "Cast to int8; TensorRT makes int8 tensors only with QuantizeLinear"
    if op in FLOAT_ONLY_OPS and any(g.types.get(i, FLOAT) not in FLOAT_TYPES for i in node.input if i):
        yield f"{op} on non-float inputs; the parser's {op} takes float32/float16/bfloat16 only"
    if op in ("QuantizeLinear", "DequantizeLinear"):
        zero = g.initializers.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if op == "QuantizeLinear" and zero is None:
            yield f"{op} without a zero point (its output would be uint8); TensorRT takes symmetric int8 Q/DQ"
        if zero is not None and (zero.data_type != onnx.TensorProto.INT8 or numpy_helper.to_array(zero).any()):
            yield f"{op}: zero point must be int8 zeros (TensorRT quantization is symmetric)"
    elif op == "Equal" and any(g.types.get(i) == onnx.TensorProto.BOOL for i in node.input):
        yield "Equal on booleans is not supported by the parser"
    elif op in LOGIC_OPS and any(g.types.get(i, BOOL) != BOOL for i in node.input):
        yield f"{op} on non-boolean inputs; the parser's {op} is boolean only"
    elif op == "Pow" and not release.integer_pow and any(g.types.get(i) in INTEGER_TYPES for i in node.input):
        yield "Pow on integers needs TensorRT 10.8 or later"
    elif op in ("Squeeze", "Unsqueeze") and not release.dynamic_unsqueeze_axes and len(node.input) > 1 \
            and node.input[1] not in g.constants:
        yield f"{op} axes from a tensor; before TensorRT 10.7 they must be constant"
    elif op in REDUCE_OPS and len(node.input) > 1 and node.input[1] and node.input[1] not in g.initializers:
        yield f"{op}: axes must be an initializer"
    elif op == "LayerNormalization" and any(o and o in g.readers for o in node.output[1:]):
        yield "LayerNormalization: only its first output is supported, but Mean/InvStdDev are read"
    elif op == "TopK":
        yield from _topk_problems(g, node)


def _topk_problems(g: _Graph, node: onnx.NodeProto) -> Iterator[str]:
    """TensorRT's TopK takes K as a build-time constant below TOPK_MAX_K (a run-time K makes the output shapes
    data-dependent) and returns sorted values only (from 10.1 the parser refuses sorted=0)."""
    k = g.initializers.get(node.input[1])
    if k is None:
        yield "TopK with K from a tensor; TensorRT takes a constant K"
    elif int(numpy_helper.to_array(k).reshape(-1)[0]) > TOPK_MAX_K:
        yield f"TopK with K {int(numpy_helper.to_array(k).reshape(-1)[0])}; TensorRT takes K <= {TOPK_MAX_K}"
    if any(a.name == "sorted" and a.i == 0 for a in node.attribute):
        yield "TopK with sorted=0; TensorRT returns sorted values only"


def _type_problems(g: _Graph, release: ParserRelease) -> Iterator[tuple[str, str]]:
    seen: set[str] = set()
    for name, elem in g.types.items():
        kind = onnx.TensorProto.DataType.Name(elem) if elem else "UNDEFINED"
        if kind in seen or elem == onnx.TensorProto.UNDEFINED:
            continue
        if kind == "DOUBLE":
            seen.add(kind)
            yield "warning", f"tensor {name!r} is float64; TensorRT narrows it to float32"
        elif kind == "INT64" and release.narrows_int64:
            seen.add(kind)
            yield "warning", (f"tensor {name!r} is int64; {release.name} has no int64 and narrows it to int32 "
                              "(engine inputs become int32; the runtime feeds them so)")
        elif kind not in release.tensor_types:
            seen.add(kind)
            yield "error", f"tensor {name!r} has type {kind}, which TensorRT does not take"

