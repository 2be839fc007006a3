"""Which nodes of an exported graph make up RMSNorm, RoPE and the relative position bias.

Opsets 17/18 have no op for any of them, so the exporter writes them as primitive ops (TensorRT fuses
them again). The fp16 converter must keep them fp32 as it keeps LayerNormalization, and `inspect` says
what they became, so both find them here: RMSNorm by its op chain, RoPE and the bias by what their
tables feed (everything from the model's cos/sin tables or bias weights up to the Add that applies it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx

RMS_NORM_CHAIN = ("ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul")  # after Pow(x, 2); torch's nn.RMSNorm
ROLE_TABLES = {"RoPE": ("rotary.cos", "rotary.sin"), "relative bias": ("relative_attention_bias.weight",)}


@dataclass(frozen=True)
class RoleGroup:
    role: str  # "RMSNorm", "RoPE" or "relative bias"
    nodes: tuple[onnx.NodeProto, ...]


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in set(node.input):
            found.setdefault(name, []).append(node)
    return found


def rms_norms(graph: onnx.GraphProto) -> list[RoleGroup]:
    """Pow(x, 2) -> ReduceMean -> Add(eps) -> Sqrt -> Reciprocal -> Mul(x, .) -> Mul(., g), one group each."""
    consumers, groups = _consumers(graph), []
    for pow_node in [n for n in graph.node if n.op_type == "Pow"]:
        chain, node = [pow_node], pow_node
        for op in RMS_NORM_CHAIN:
            readers = consumers.get(node.output[0], [])
            if len(readers) != 1 or readers[0].op_type != op:
                break
            node = readers[0]
            chain.append(node)
        if len(chain) == len(RMS_NORM_CHAIN) + 1 and pow_node.input[0] in chain[-2].input:
            groups.append(RoleGroup("RMSNorm", tuple(chain)))
    return groups


def _applied_tables(graph: onnx.GraphProto, role: str) -> list[RoleGroup]:
    """Every node downstream of the role's tables, stopping at (and including) the Adds that apply them."""
    consumers = _consumers(graph)
    tables = [i.name for i in graph.initializer if i.name.endswith(ROLE_TABLES[role])]
    seen: dict[str, onnx.NodeProto] = {}
    frontier = list(tables)
    while frontier:
        for node in consumers.get(frontier.pop(), []):
            if node.name not in seen:
                seen[node.name] = node
                frontier += [] if node.op_type == "Add" else list(node.output)
    ordered = [n for n in graph.node if n.name in seen]
    return [RoleGroup(role, tuple(ordered))] if ordered else []


def role_groups(graph: onnx.GraphProto) -> list[RoleGroup]:
    """RMSNorm (one group per norm), RoPE and relative bias (one group each per graph)."""
    return rms_norms(graph) + _applied_tables(graph, "RoPE") + _applied_tables(graph, "relative bias")


def role_nodes(graph: onnx.GraphProto) -> dict[str, str]:
    """Node name -> the role it belongs to."""
    return {node.name: group.role for group in role_groups(graph) for node in group.nodes}


def role_summary(graph: onnx.GraphProto) -> dict[str, str]:
    """Role -> 'N x (ops)' for inspect, e.g. RMSNorm -> '8 x (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul)'."""
    groups: dict[str, list[RoleGroup]] = {}
    for group in role_groups(graph):
        groups.setdefault(group.role, []).append(group)
    summary = {}
    for role, found in groups.items():
        if role == "RMSNorm":
            summary[role] = f"{len(found)} x ({', '.join(n.op_type for n in found[0].nodes)})"
        else:
            ops = Counter(n.op_type for n in found[0].nodes)
            summary[role] = ", ".join(f"{op} {count}" for op, count in ops.items())
    return summary
