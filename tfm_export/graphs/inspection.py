"""`tfm-export inspect`: what is in a model directory, read from the graphs themselves."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifacts.model_dir import ModelDir
from ..core.graph_spec import Graph
from ..core.variants import describe
from .onnx_io import load_graph, tensors_of
from .roles import role_summary


@dataclass(frozen=True)
class GraphInfo:
    name: str
    file: Path
    size_bytes: int
    opset: int
    precision: str
    inputs: list[dict[str, Any]]  # name, dtype, shape
    outputs: list[dict[str, Any]]
    op_counts: dict[str, int]
    weight_count: int
    weight_bytes: int
    roles: dict[str, str]  # RMSNorm / RoPE / relative bias -> the primitive ops they became


def inspect_model(model_dir: Path) -> tuple[ModelDir, list[GraphInfo]]:
    directory = ModelDir.read(model_dir)
    directory.vocabulary()  # every file the manifest lists is checked, tokenizers included
    infos = []
    for name in [g.value for g in Graph if directory.has(g)]:
        path = directory.graph_path(name)
        proto = load_graph(directory, name)
        opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
        inits = proto.graph.initializer
        infos.append(GraphInfo(
            name, path, path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(f"{path.name}.data")),
            opset, directory.precision, tensors_of(proto.graph.input), tensors_of(proto.graph.output),
            dict(Counter(n.op_type for n in proto.graph.node).most_common()),
            sum(1 for _ in inits), sum(len(i.raw_data) for i in inits), role_summary(proto.graph)))
    return directory, infos


def summary_lines(directory: ModelDir, infos: list[GraphInfo]) -> list[str]:
    """What `tfm-export inspect` prints: the model line, then per graph its size, tensors and op counts. Only
    what ModelDir.read checked is read, so a damaged manifest is its one-line error, never a KeyError here."""
    cfg, manifest = directory.config, directory.manifest
    lines = [f"{directory.path}: {directory.precision}, opset {manifest.opset}, d_model {cfg.d_model}, "
             f"{cfg.n_layers}+{cfg.n_layers} layers, {cfg.n_head} heads, vocab "
             f"{cfg.src_vocab_size}/{cfg.trg_vocab_size}, max {directory.limits['max_source_length']} "
             f"positions; optimizations: {', '.join(manifest.optimizations) or 'none'}",
             f"architecture: {describe(cfg.variant())}"]
    for g in infos:
        lines += ["", f"{g.file.name}: {g.size_bytes / 1e6:.2f} MB, {g.weight_count} weights "
                      f"({g.weight_bytes / 1e6:.2f} MB), opset {g.opset}"]
        for kind, values in (("in ", g.inputs), ("out", g.outputs)):
            lines += [f"  {kind} {t['name']:36} {t['dtype']:8} [{', '.join(map(str, t['shape']))}]" for t in values]
        lines.append("  ops: " + ", ".join(f"{op} {n}" for op, n in g.op_counts.items()))
        lines += [f"  {role} as primitive ops: {ops}" for role, ops in g.roles.items()]
    return lines
