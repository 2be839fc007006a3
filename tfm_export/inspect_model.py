"""`tfm-export inspect`: what is in a model directory, read from the graphs themselves."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx

from .graph_spec import Graph
from .model_dir import graph_path, load_graph, read_manifest


@dataclass(frozen=True)
class GraphInfo:
    name: str
    file: Path
    size_bytes: int
    opset: int
    precision: str
    inputs: list[tuple[str, str, list[str | int]]]  # name, dtype, shape
    outputs: list[tuple[str, str, list[str | int]]]
    op_counts: dict[str, int]
    weight_count: int
    weight_bytes: int


def _values(values) -> list[tuple[str, str, list[str | int]]]:
    return [(v.name, onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
             [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]) for v in values]


def inspect_model(directory: Path) -> tuple[dict, list[GraphInfo]]:
    manifest = read_manifest(directory)
    infos = []
    for name in [g.value for g in Graph if g.value in manifest["graphs"]]:
        path = graph_path(directory, manifest, name)
        proto = load_graph(directory, manifest, name)
        opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
        inits = proto.graph.initializer
        infos.append(GraphInfo(
            name, path, path.stat().st_size + sum(p.stat().st_size for p in directory.glob(f"{path.name}.data")),
            opset, manifest.get("precision", "fp32"), _values(proto.graph.input), _values(proto.graph.output),
            dict(Counter(n.op_type for n in proto.graph.node).most_common()),
            sum(1 for _ in inits), sum(len(i.raw_data) for i in inits)))
    return manifest, infos
