"""How torch.onnx's TorchScript exporter writes the ops it has no rule for: torch's RMSNorm, and this package's own
ops (graphs.buffer_cache), each one ONNX node or a fixed decomposition.

The TorchScript exporter traces a graph in a fraction of a second where torch.export takes seconds per layer (the
demo's four graphs: 1.5 s against 51 s), which is what makes the export of a 24-layer model a matter of seconds.
"""

from __future__ import annotations

import functools

import torch
from torch.onnx import register_custom_op_symbolic
from torch.onnx import symbolic_helper as sh

from ..core.graph_spec import SUPPORTED_OPSETS
from .buffer_cache import MS


@sh.parse_args("v", "is", "v", "f")
def _rms_norm(g, x, shape, weight, eps):
    """x * 1/sqrt(mean(x^2) + eps) * weight over the last len(shape) axes, the ops torch's own decomposition of
    nn.RMSNorm writes (graphs.roles finds the chain by them); eps None: float32's machine epsilon."""
    axes = list(range(-len(shape), 0))
    squares = g.op("Pow", x, g.op("Constant", value_t=torch.tensor(2.0)))
    if g.opset >= 18:
        mean = g.op("ReduceMean", squares, g.op("Constant", value_t=torch.tensor(axes)), keepdims_i=1)
    else:
        mean = g.op("ReduceMean", squares, axes_i=axes, keepdims_i=1)
    eps = torch.finfo(torch.float32).eps if eps is None else eps
    root = g.op("Sqrt", g.op("Add", mean, g.op("Constant", value_t=torch.tensor(eps, dtype=torch.float32))))
    normed = g.op("Mul", x, g.op("Reciprocal", root))
    return normed if sh._is_none(weight) else g.op("Mul", normed, weight)


@sh.parse_args("v", "i")
def _squeeze(g, x, dim):
    """One Squeeze of the axis. torch's exporter writes an If (squeeze only where the size is 1) when the traced
    size is not known to it; the one squeeze this package exports is of the step's one new token, size 1 by the
    graph contract."""
    if g.opset >= 13:
        return g.op("Squeeze", x, g.op("Constant", value_t=torch.tensor([dim])))
    return g.op("Squeeze", x, axes_i=[dim])


def _write_at(g, buffer, index, update):
    return g.op("ScatterND", buffer, index, update)


@sh.parse_args("v", "v", "v", "v", "v", "v", "v", "i")
def _group_query_attention(g, query, key, value, past_key, past_value, seqlens_k, total, num_heads):
    outputs = g.op(f"{MS}::GroupQueryAttention", query, key, value, past_key, past_value, seqlens_k, total,
                   num_heads_i=num_heads, kv_num_heads_i=num_heads, outputs=3)
    for output, like in zip(outputs, (query, past_key, past_value), strict=True):  # the kernel's shapes
        output.setType(like.type())
    return outputs


@sh.parse_args("v", "v", "v", "v", "i", "f")
def _multi_head_attention(g, query, key, value, key_padding_mask, num_heads, mask_filter_value):
    no_bias = sh._optional_input_placeholder_tensor(g)
    output = g.op(f"{MS}::MultiHeadAttention", query, key, value, no_bias, key_padding_mask, num_heads_i=num_heads,
                  mask_filter_value_f=mask_filter_value)
    output.setType(query.type())
    return output


SYMBOLICS = {"aten::rms_norm": _rms_norm, "aten::squeeze": _squeeze, "tfm::write_at": _write_at,
             "tfm::group_query_attention": _group_query_attention,
             "tfm::multi_head_attention": _multi_head_attention}


@functools.cache
def register() -> None:
    """Once per process, for every opset the exporter writes."""
    for name, symbolic in SYMBOLICS.items():
        for opset in SUPPORTED_OPSETS:
            register_custom_op_symbolic(name, symbolic, opset)
