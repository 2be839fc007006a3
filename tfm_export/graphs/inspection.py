"""`tfm-export inspect`: what is in a model directory, read from the graphs themselves."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifacts.model_dir import graph_path, load_vocabulary, read_manifest
from ..core.config import ModelConfig
from ..core.graph_spec import Graph, GraphVariant
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


def inspect_model(directory: Path) -> tuple[dict, list[GraphInfo]]:
    manifest = read_manifest(directory)
    load_vocabulary(directory, manifest)  # every file the manifest lists is checked, tokenizers included
    infos = []
    for name in [g.value for g in (*Graph, *GraphVariant) if g.value in manifest["graphs"]]:
        path = graph_path(directory, manifest, name)
        proto = load_graph(directory, manifest, name)
        opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
        inits = proto.graph.initializer
        infos.append(GraphInfo(
            name, path, path.stat().st_size + sum(p.stat().st_size for p in directory.glob(f"{path.name}.data")),
            opset, manifest.get("precision", "fp32"), tensors_of(proto.graph.input), tensors_of(proto.graph.output),
            dict(Counter(n.op_type for n in proto.graph.node).most_common()),
            sum(1 for _ in inits), sum(len(i.raw_data) for i in inits), role_summary(proto.graph)))
    return manifest, infos


def summary_lines(directory: Path, manifest: dict[str, Any], infos: list[GraphInfo]) -> list[str]:
    """What `tfm-export inspect` prints: the model line, then per graph its size, tensors and op counts. Only
    what read_manifest checked is read, so a damaged manifest is its one-line error, never a KeyError here."""
    cfg = ModelConfig.from_dict(manifest["model"])  # every field read_manifest checked, defaults filled in
    lines = [f"{directory}: {manifest['precision']}, opset {manifest['opset']}, d_model {cfg.d_model}, "
             f"{cfg.n_layers}+{cfg.n_layers} layers, {cfg.n_head} heads, vocab "
             f"{cfg.src_vocab_size}/{cfg.trg_vocab_size}, max {manifest['limits']['max_source_length']} "
             f"positions; optimizations: {', '.join(manifest['optimizations']) or 'none'}",
             f"architecture: {describe(cfg.variant())}"]
    for g in infos:
        lines += ["", f"{g.file.name}: {g.size_bytes / 1e6:.2f} MB, {g.weight_count} weights "
                      f"({g.weight_bytes / 1e6:.2f} MB), opset {g.opset}"]
        for kind, values in (("in ", g.inputs), ("out", g.outputs)):
            lines += [f"  {kind} {t['name']:36} {t['dtype']:8} [{', '.join(map(str, t['shape']))}]" for t in values]
        lines.append("  ops: " + ", ".join(f"{op} {n}" for op, n in g.op_counts.items()))
        lines += [f"  {role} as primitive ops: {ops}" for role, ops in g.roles.items()]
    return lines
