"""decoder_step_fused: decoder_step_buffered's step written with ONNX Runtime's fused CPU operators, for
tfm-run on the CPU (core.graph_spec.GraphVariant).

Self-attention is com.microsoft GroupQueryAttention on the packed Q/K/V: it reads the caller's cache buffer
up to `seqlens_k` and writes the new token's key/value into it at that position itself, when the buffer is
bound as both its past input and its present output (no copy of the cache, none of the new token's). Cross-
attention is MultiHeadAttention on the encoder's keys/values, a source's beams as one query sequence; a
residual with its LayerNorm is SkipLayerNormalization: 15 nodes a layer where decoder_step_buffered has
~40. Built from the reference model's weights (as CTranslate2's converter builds its model from a spec),
since no exporter writes these operators from PyTorch; export's parity check holds it to PyTorch like the
other graphs. It saves com.microsoft operators, which TensorRT and the runtimes the contract serves do not
take: only ONNX Runtime opens it, and the classic architecture with equal key and value sizes only.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import Tensor, nn

from ..core.graph_spec import SEQLENS_K, TOTAL_SEQUENCE_LENGTH, GraphSpec, TensorSpec
from ..model.transformer import Transformer
from .buffered import MASKED

MS_DOMAIN = "com.microsoft"
ONNX_TYPES = {"int64": TensorProto.INT64, "int32": TensorProto.INT32, "float32": TensorProto.FLOAT}


def _matrix(t: Tensor) -> np.ndarray:
    """A Linear's (out, in) weight as the (in, out) matrix a MatMul takes."""
    return np.ascontiguousarray(t.detach().float().numpy().T)


class _Builder:
    """Nodes and initializers of one graph; `op` returns the node's output names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray | Tensor) -> str:
        array = value.detach().float().numpy() if isinstance(value, Tensor) else value
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs) -> list[str]:
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=outputs[0], domain=domain, **attrs))
        return outputs

    def norm(self, norm: nn.LayerNorm, out: str, residual: str, x: str, i: str, bias: str | None = None) -> str:
        """LayerNorm(residual + x (+ bias)) in one node."""
        inputs = [out, x, self.const(f"{i}.weight", norm.weight), self.const(f"{i}.bias", norm.bias)]
        return self.op("SkipLayerNormalization", inputs + ([bias] if bias else []), [residual], MS_DOMAIN,
                       epsilon=norm.eps)[0]


def _layer(g: _Builder, layer: nn.Module, x: str, i: int, names: dict[str, str]) -> str:
    """One post-norm decoder layer; names: its cache and cross inputs and present outputs."""
    slf, enc, ffn, heads = layer.slf_attn, layer.enc_attn, layer.pos_ffn, layer.slf_attn.n_head
    qkv = torch.cat([slf.w_qs.weight, slf.w_ks.weight, slf.w_vs.weight])
    qkv = g.op("MatMul", [x, g.const(f"l{i}.qkv", _matrix(qkv))], [f"l{i}.qkv_out"])[0]
    ctx = g.op("GroupQueryAttention", [qkv, "", "", names["key"], names["value"], SEQLENS_K,
                                       TOTAL_SEQUENCE_LENGTH],
               [f"l{i}.self_ctx", names["present_key"], names["present_value"]], MS_DOMAIN,
               num_heads=heads, kv_num_heads=heads)[0]
    out = g.op("MatMul", [ctx, g.const(f"l{i}.self_fc", _matrix(slf.fc.weight))], [f"l{i}.self_out"])[0]
    x = g.norm(slf.layer_norm, out, f"l{i}.x1", x, f"l{i}.self_norm")
    q = g.op("MatMul", [x, g.const(f"l{i}.cross_q", _matrix(enc.w_qs.weight))], [f"l{i}.cross_q_out"])[0]
    q = g.op("Reshape", [q, "by_source"], [f"l{i}.cross_q_grouped"])[0]  # (sources, beams, C)
    ctx = g.op("MultiHeadAttention", [q, names["cross_key"], names["cross_value"], "", "source_mask"],
               [f"l{i}.cross_ctx"], MS_DOMAIN, num_heads=heads, mask_filter_value=MASKED)[0]
    ctx = g.op("Reshape", [ctx, "by_row"], [f"l{i}.cross_ctx_rows"])[0]
    out = g.op("MatMul", [ctx, g.const(f"l{i}.cross_fc", _matrix(enc.fc.weight))], [f"l{i}.cross_out"])[0]
    x = g.norm(enc.layer_norm, out, f"l{i}.x2", x, f"l{i}.cross_norm")
    hidden = g.op("MatMul", [x, g.const(f"l{i}.w_1", _matrix(ffn.w_1.weight))], [f"l{i}.ffn_in"])[0]
    hidden = g.op("Add", [hidden, g.const(f"l{i}.b_1", ffn.w_1.bias)], [f"l{i}.ffn_biased"])[0]
    hidden = g.op("Relu", [hidden], [f"l{i}.ffn_hidden"])[0]
    out = g.op("MatMul", [hidden, g.const(f"l{i}.w_2", _matrix(ffn.w_2.weight))], [f"l{i}.ffn_out"])[0]
    return g.norm(ffn.layer_norm, out, f"l{i}.x3", x, f"l{i}.ffn_norm", g.const(f"l{i}.b_2", ffn.w_2.bias))


def _embed(g: _Builder, model: Transformer, table: str) -> str:
    """The reference's embedding (x sqrt(d_model)) + the position row of `cache_length`, then its LayerNorm."""
    dec, cfg = model.decoder, model.config
    x = g.op("Gather", [table, "input_ids"], ["embedded"])[0]
    if cfg.scale_emb:
        x = g.op("Mul", [x, g.const("embedding_scale", np.array(cfg.d_model ** 0.5, np.float32))], ["scaled"])[0]
    position = g.op("Gather", [g.const("position_table", dec.position_enc.pos_table[0]), "cache_length"],
                    ["position"])[0]
    x = g.op("Add", [x, position], ["positioned"])[0]
    norm = dec.layer_norm
    return g.op("LayerNormalization", [x, g.const("embedding_norm.weight", norm.weight),
                                       g.const("embedding_norm.bias", norm.bias)],
                ["x0"], axis=-1, epsilon=norm.eps)[0]


def _shapes(g: _Builder, cfg) -> None:
    """The source mask as MultiHeadAttention takes it, and the shapes that group rows by source and back."""
    g.op("Cast", ["encoder_attention_mask"], ["source_mask"], to=TensorProto.INT32)
    sources = g.op("Shape", ["encoder_attention_mask"], ["sources"], start=0, end=1)[0]
    width = cfg.n_head * cfg.d_k
    g.op("Concat", [sources, g.const("beams_and_width", np.array([-1, width], np.int64))], ["by_source"], axis=0)
    g.const("by_row", np.array([-1, 1, width], np.int64))


def fused_step_graph(model: Transformer, spec: GraphSpec, table: str, opset: int) -> onnx.ModelProto:
    """The graph of `spec` (core.graph_spec.fused_step_spec) for this model; `table`: the name its tied
    embedding table has in the encoder, so that both can share it."""
    cfg, g = model.config, _Builder()
    g.const(table, model.decoder.trg_word_emb.weight)
    _shapes(g, cfg)
    x = _embed(g, model, table)
    inputs = [t.name for t in spec.inputs[5:]]
    presents = [t.name for t in spec.outputs[1:]]
    for i, layer in enumerate(model.decoder.layer_stack):
        key, value, cross_key, cross_value = inputs[4 * i:4 * i + 4]
        names = {"key": key, "value": value, "cross_key": cross_key, "cross_value": cross_value,
                 "present_key": presents[2 * i], "present_value": presents[2 * i + 1]}
        x = _layer(g, layer, x, i, names)
    if cfg.proj_share_weight:  # the tied table, transposed when the session opens (no second copy saved)
        projection = g.op("Transpose", [table], ["projection"], perm=[1, 0])[0]
    else:
        projection = g.const("projection", _matrix(model.trg_word_prj.weight))
    logits = g.op("MatMul", [x, projection], ["unscaled_logits"])[0]
    scale = cfg.d_model ** -0.5 if cfg.scale_prj else 1.0
    g.op("Mul", [logits, g.const("logit_scale", np.array(scale, np.float32))], [spec.outputs[0].name])

    def values(specs: tuple[TensorSpec, ...]) -> list[onnx.ValueInfoProto]:
        return [helper.make_tensor_value_info(t.name, ONNX_TYPES[t.dtype], list(t.shape)) for t in specs]
    graph = helper.make_graph(g.nodes, spec.graph.value, values(spec.inputs), values(spec.outputs), g.inits)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS_DOMAIN, 1)]
    # the oldest file format the opset allows (as the exporter writes), not the onnx package's newest, which
    # older ONNX Runtime releases refuse to load
    return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets[:1]))
