"""How fast a whole decoder step can be in ONNX Runtime on this machine: the classic model's step rebuilt from
its own weights out of ONNX Runtime's fused CPU operators, 13 nodes a layer, no search around it, timed at its
best over thread counts and spinning. Self-attention is com.microsoft GroupQueryAttention on the packed Q/K/V,
over a cache buffer it extends in place (bound as both its past and its present); cross-attention is
MultiHeadAttention on the encoder's keys/values; residual + LayerNorm is SkipLayerNormalization. Measured here
against MultiHeadAttention concatenating its past, and against Attention with Q/K/V inside, this self-attention
was the fastest. It is a whole step: its logits match the reference model's. Where the step time 1.25x
CTranslate2 allows is below this, no graph of ONNX Runtime's kernels, and no loop around them, meets the target.
A graph for measuring only: it saves com.microsoft operators, which TensorRT and the other runtimes the
contract serves do not take."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from torch import Tensor, nn

from ..core.errors import TfmExportError
from ..core.variants import describe
from ..runtime.session import SessionOptions
from .kernel_floor import best_run_ms

MS_DOMAIN = "com.microsoft"


def _weight(t: Tensor) -> np.ndarray:
    """A Linear's (out, in) weight as the (in, out) matrix a MatMul takes."""
    return np.ascontiguousarray(t.detach().float().numpy().T)


class _Builder:
    """Nodes and initializers of one graph; each helper returns its output names."""

    def __init__(self) -> None:
        from onnx import numpy_helper
        self.nodes: list = []
        self.inits: list = []
        self._array = numpy_helper.from_array

    def const(self, name: str, value: np.ndarray | Tensor) -> str:
        array = value.detach().float().numpy() if isinstance(value, Tensor) else value
        self.inits.append(self._array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs) -> list[str]:
        from onnx import helper
        self.nodes.append(helper.make_node(op_type, inputs, outputs, domain=domain, **attrs))
        return outputs


def _layer(g: _Builder, layer: nn.Module, x: str, i: int, cfg) -> tuple[str, list[str]]:
    """One post-norm decoder layer: self-attention over the cache, cross-attention, FFN."""
    import torch
    slf, enc, ffn = layer.slf_attn, layer.enc_attn, layer.pos_ffn
    eps = slf.layer_norm.eps
    qkv = torch.cat([slf.w_qs.weight, slf.w_ks.weight, slf.w_vs.weight]).T
    qkv = g.op("MatMul", [x, g.const(f"wqkv{i}", qkv)], [f"qkv{i}"])[0]
    ctx, key, value = g.op("GroupQueryAttention", [qkv, "", "", f"cache_key.{i}", f"cache_value.{i}", "seqlens_k",
                                                   "total_sequence_length"],
                           [f"ctx{i}", f"present_key.{i}", f"present_value.{i}"], MS_DOMAIN,
                           num_heads=cfg.n_head, kv_num_heads=cfg.n_head)
    out = g.op("MatMul", [ctx, g.const(f"wo{i}", _weight(slf.fc.weight))], [f"o{i}"])[0]
    x = g.op("SkipLayerNormalization", [out, x, g.const(f"ln1g{i}", slf.layer_norm.weight),
                                        g.const(f"ln1b{i}", slf.layer_norm.bias)], [f"x1_{i}"], MS_DOMAIN,
             epsilon=eps)[0]
    q = g.op("MatMul", [x, g.const(f"wcq{i}", _weight(enc.w_qs.weight))], [f"cq{i}"])[0]
    ctx = g.op("MultiHeadAttention", [q, f"cross_key.{i}", f"cross_value.{i}", "", "source_mask"], [f"cctx{i}"],
               MS_DOMAIN, num_heads=cfg.n_head)[0]
    out = g.op("MatMul", [ctx, g.const(f"wco{i}", _weight(enc.fc.weight))], [f"co{i}"])[0]
    x = g.op("SkipLayerNormalization", [out, x, g.const(f"ln2g{i}", enc.layer_norm.weight),
                                        g.const(f"ln2b{i}", enc.layer_norm.bias)], [f"x2_{i}"], MS_DOMAIN,
             epsilon=eps)[0]
    hidden = g.op("MatMul", [x, g.const(f"w1{i}", _weight(ffn.w_1.weight))], [f"f{i}"])[0]
    hidden = g.op("Relu", g.op("Add", [hidden, g.const(f"b1{i}", ffn.w_1.bias)], [f"fb{i}"]), [f"fr{i}"])[0]
    out = g.op("MatMul", [hidden, g.const(f"w2{i}", _weight(ffn.w_2.weight))], [f"f2{i}"])[0]
    x = g.op("SkipLayerNormalization", [out, x, g.const(f"ln3g{i}", ffn.layer_norm.weight),
                                        g.const(f"ln3b{i}", ffn.layer_norm.bias), g.const(f"b2{i}", ffn.w_2.bias)],
             [f"x3_{i}"], MS_DOMAIN, epsilon=eps)[0]
    return x, [key, value]


def supports(cfg) -> bool:
    return cfg.is_classic and cfg.d_k == cfg.d_v


def fused_step(model: nn.Module) -> bytes:
    """The classic model's decoder step as ONNX Runtime's fused operators. Inputs: token and position (B, 1);
    source_mask (B, S) int32; seqlens_k (B,) int32, the filled cache positions; total_sequence_length, one more;
    per layer cache_key/cache_value (B, H, capacity, d_k) and cross_key/cross_value (B, H, S, d_k). Outputs:
    logits (B, 1, V), then each layer's present key and value: its cache buffer with the new token's written at
    seqlens_k (the same memory when bound to the buffer)."""
    from onnx import TensorProto, helper
    cfg = model.config
    if not supports(cfg):
        raise TfmExportError(f"the step floor rebuilds the classic model only (this one: {describe(cfg.variant())}, "
                             f"d_k {cfg.d_k}, d_v {cfg.d_v}); measure a classic config")
    dec, g = model.decoder, _Builder()
    table = dec.trg_word_emb.weight * (cfg.d_model ** 0.5 if cfg.scale_emb else 1.0)
    x = g.op("Add", [g.op("Gather", [g.const("embedding", table), "token"], ["emb"])[0],
                     g.op("Gather", [g.const("positions", dec.position_enc.pos_table[0]), "position"], ["pos"])[0]],
             ["x0"])[0]
    x = g.op("LayerNormalization", [x, g.const("ln0g", dec.layer_norm.weight), g.const("ln0b", dec.layer_norm.bias)],
             ["x"], axis=-1, epsilon=dec.layer_norm.eps)[0]
    presents = []
    for i, layer in enumerate(dec.layer_stack):
        x, kv = _layer(g, layer, x, i, cfg)
        presents += kv
    logits = g.op("MatMul", [x, g.const("projection", _weight(model.trg_word_prj.weight))], ["raw_logits"])[0]
    g.op("Mul", [logits, g.const("logit_scale", np.array(cfg.d_model ** -0.5 if cfg.scale_prj else 1.0,
                                                         np.float32))], ["logits"])
    int32, int64, f32 = TensorProto.INT32, TensorProto.INT64, TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(*spec) for spec in (
        ("token", int64, ["B", 1]), ("position", int64, ["B", 1]), ("source_mask", int32, ["B", "S"]),
        ("seqlens_k", int32, ["B"]), ("total_sequence_length", int32, []))]
    for i in range(cfg.n_layers):
        inputs += [helper.make_tensor_value_info(f"{kind}.{i}", f32, ["B", cfg.n_head, length, cfg.d_k])
                   for kind, length in (("cache_key", "C"), ("cache_value", "C"), ("cross_key", "S"),
                                        ("cross_value", "S"))]
    outputs = [helper.make_tensor_value_info(n, f32, None) for n in ["logits", *presents]]
    graph = helper.make_graph(g.nodes, "fused_step", inputs, outputs, g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(MS_DOMAIN, 1)]).SerializeToString()


def step_inputs(model: nn.Module, rows: int, cache_length: int, source_length: int) -> dict[str, np.ndarray]:
    """Random cache and cross keys/values of the given sizes (values do not change the time; the position is
    kept inside the model's table); cache buffers with room for the new token."""
    cfg, rng = model.config, np.random.default_rng(0)
    position = min(cache_length, cfg.n_position - 1)
    feeds = {"token": np.full((rows, 1), 4, np.int64), "position": np.full((rows, 1), position, np.int64),
             "source_mask": np.ones((rows, source_length), np.int32),
             "seqlens_k": np.full(rows, cache_length, np.int32),
             "total_sequence_length": np.array(cache_length + 1, np.int32)}
    for i in range(cfg.n_layers):
        for kind, length in (("cache_key", cache_length + 1), ("cache_value", cache_length + 1),
                             ("cross_key", source_length), ("cross_value", source_length)):
            feeds[f"{kind}.{i}"] = rng.standard_normal((rows, cfg.n_head, length, cfg.d_k), dtype=np.float32)
    return feeds


def present_of(name: str) -> str | None:
    """The output a cache input is bound to as well (the buffer the step extends in place)."""
    return name.replace("cache_", "present_") if name.startswith("cache_") else None


def step_floor_ms(model: nn.Module, rows: int, cache_length: int, source_length: int,
                  threads: int = 0) -> dict[str, float]:
    """Best step time (ms) of the fused graph at `rows` rows after `cache_length` cached tokens, per setting:
    `threads` intra-op threads and one, each spinning within the run and sleeping."""
    feeds = step_inputs(model, rows, cache_length, source_length)
    best = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fused_step.onnx"
        path.write_bytes(fused_step(model))
        for count in dict.fromkeys((threads, 1)):
            for spinning in (True, False):
                label = f"{count or 'all'} thread{'s' if count != 1 else ''}, {'spinning' if spinning else 'sleeping'}"
                best[label] = best_run_ms(path, feeds, SessionOptions(intra_op_threads=count, spinning=spinning),
                                          present_of)
    return best
