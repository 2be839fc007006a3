"""encoder.onnx + decoder_step.onnx -> generate.onnx: ONNX Runtime's BeamSearch op (com.microsoft, model_type 1)
running the whole greedy or beam search in one `session.run`, so an app in any language needs no decoding loop.

Graph surgery only: the op wants its encoder subgraph to take int32 `encoder_input_ids`/`encoder_attention_mask`
and return only the cross-attention K/V (`present_key_cross_{i}`, ...), and its decoder subgraph to take int32
`input_ids` [B, 1] and `encoder_attention_mask`, every self-attention past before every cross one, and return
`logits` and the self-attention presents (core.generate_spec). Casts to int64 go in front, tensors are renamed
and reordered; the computation is the exported graphs' own.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .. import __version__
from ..artifacts.model_dir import ModelDir
from ..core.config import ModelConfig
from ..core.generate_spec import (
    DECODER_INPUTS,
    ENCODER_INPUTS,
    GENERATE_FILE,
    INPUTS,
    OUTPUTS,
    decoder_inputs,
    decoder_outputs,
    encoder_outputs,
    op_name,
)
from ..core.graph_spec import (
    ATTENTION_MASK,
    BATCH,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    SRC_LEN,
    Graph,
    cache_names,
)
from ..core.tokenizer import BOS_ID, EOS_ID, PAD_ID
from .onnx_io import ExportError

SHARED_MIN_ELEMENTS = 1024  # weights both subgraphs hold are stored once, in the main graph, from this size
ONNX_TYPES = {"int32": TensorProto.INT32, "float32": TensorProto.FLOAT}


def op_refusal(directory: ModelDir) -> str | None:
    """Why the BeamSearch op cannot take this directory's graphs, or None."""
    dtypes = directory.tensor_types(Graph.DECODER_STEP)
    cache = dtypes.get(cache_names(directory.config).self_inputs[0], "float32")
    if cache != dtypes.get(LOGITS, "float32"):
        return (f"{directory.path}: its decoder_step takes a {cache} KV cache but returns {dtypes.get(LOGITS)} "
                "logits; ONNX Runtime's BeamSearch needs the logits in the cache's dtype (and its CPU kernel takes "
                "float32 only), so make the fp16 directory with `tfm-export quantize --precision fp16 "
                "--keep-io-types`, or use the fp32 directory")
    return None


def _rename(graph: onnx.GraphProto, old: str, new: str) -> None:
    """A tensor renamed wherever the graph mentions it."""
    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        node.output[:] = [new if name == old else name for name in node.output]
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.name == old:
            value.name = new


def _int32_inputs(graph: onnx.GraphProto, renames: dict[str, str], shapes: dict[str, list]) -> None:
    """Each int64 input becomes an int32 input of its new name, cast back to int64 for the graph's own nodes."""
    for old, new in renames.items():
        inner = f"{old}__int64"
        _rename(graph, old, inner)
        index = next(i for i, v in enumerate(graph.input) if v.name == inner)
        graph.input.remove(graph.input[index])
        graph.input.insert(index, helper.make_tensor_value_info(new, TensorProto.INT32, shapes[new]))
        graph.node.insert(0, helper.make_node("Cast", [new], [inner], to=TensorProto.INT64, name=f"{new}_to_int64"))


def _ordered(values, names: list[str]) -> list[onnx.ValueInfoProto]:
    by_name = {v.name: v for v in values}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ExportError(f"the graph lacks {', '.join(missing)}, which the BeamSearch op needs; export it again")
    return [by_name[n] for n in names]


def encoder_subgraph(proto: onnx.ModelProto, cfg: ModelConfig) -> onnx.GraphProto:
    """int32 ids and mask in; only the cross-attention K/V out (last_hidden_state is dropped)."""
    graph = onnx.GraphProto()
    graph.CopyFrom(proto.graph)
    src = [BATCH, SRC_LEN]
    _int32_inputs(graph, ENCODER_INPUTS, {new: src for new in ENCODER_INPUTS.values()})
    for name in cache_names(cfg).cross_outputs:
        _rename(graph, name, op_name(name))
    outputs = _ordered(graph.output, encoder_outputs(cfg))
    del graph.output[:]
    graph.output.extend(outputs)
    graph.name = "encoder"
    return graph


def decoder_subgraph(proto: onnx.ModelProto, cfg: ModelConfig) -> onnx.GraphProto:
    """int32 ids [B, 1] and mask in, self-attention past before cross; logits and self-attention presents out."""
    graph = onnx.GraphProto()
    graph.CopyFrom(proto.graph)
    _int32_inputs(graph, DECODER_INPUTS, {INPUT_IDS: [BATCH, 1],
                                          ENCODER_ATTENTION_MASK: [BATCH, SRC_LEN]})
    names = cache_names(cfg)
    for name in (*names.self_inputs, *names.cross_inputs, *names.self_outputs):
        _rename(graph, name, op_name(name))
    inputs, outputs = _ordered(graph.input, decoder_inputs(cfg)), _ordered(graph.output, decoder_outputs(cfg))
    del graph.input[:], graph.output[:]
    graph.input.extend(inputs)
    graph.output.extend(outputs)
    graph.name = "decoder"
    return graph


def share_initializers(encoder: onnx.GraphProto, decoder: onnx.GraphProto) -> list[TensorProto]:
    """Weights both subgraphs hold (a shared source/target embedding) moved to the main graph, stored once;
    each subgraph reads it from the outer scope, with its type declared as ONNX Runtime requires."""
    def key(init: TensorProto) -> tuple:  # an external tensor by where it lies (one file: one place, one tensor)
        where = tuple((e.key, e.value) for e in init.external_data) if init.data_location == TensorProto.EXTERNAL \
            else numpy_helper.to_array(init).tobytes()
        return init.data_type, tuple(init.dims), where
    big = lambda init: int(np.prod(init.dims)) >= SHARED_MIN_ELEMENTS  # noqa: E731
    in_encoder = {key(init): init for init in encoder.initializer if big(init)}
    shared = []
    for init in [i for i in decoder.initializer if big(i)]:
        twin = in_encoder.pop(key(init), None)
        if twin is None:
            continue
        moved = TensorProto()
        moved.CopyFrom(init)
        moved.name = f"shared_weight_{len(shared)}"
        for graph, own in ((encoder, twin), (decoder, init)):
            _rename(graph, own.name, moved.name)
            graph.initializer.remove(own)
            graph.value_info.append(helper.make_tensor_value_info(moved.name, moved.data_type, list(moved.dims)))
        shared.append(moved)
    return shared


def generate_graph(encoder: onnx.ModelProto, decoder: onnx.ModelProto, cfg: ModelConfig,
                   early_stopping: bool = False) -> onnx.ModelProto:
    """The BeamSearch graph. The source mask is computed in the graph (ids != <blank>): the op's own mask would
    cover only left padding, and these models take right-padded sources. <blank> is never generated."""
    enc, dec = encoder_subgraph(encoder, cfg), decoder_subgraph(decoder, cfg)
    shared = share_initializers(enc, dec)
    vocab_mask = np.ones(cfg.trg_vocab_size, np.int32)
    vocab_mask[PAD_ID] = 0
    constants = [numpy_helper.from_array(np.array(PAD_ID, np.int32), "pad_id"),
                 numpy_helper.from_array(vocab_mask, "vocab_mask")]
    mask = [helper.make_node("Equal", [INPUT_IDS, "pad_id"], ["is_pad"], name="source_pad"),
            helper.make_node("Not", ["is_pad"], ["is_token"], name="source_token"),
            helper.make_node("Cast", ["is_token"], [ATTENTION_MASK], to=TensorProto.INT32, name="source_mask")]
    search = helper.make_node(
        "BeamSearch", [*(t.name for t in INPUTS), "", "vocab_mask", "", ATTENTION_MASK],
        [t.name for t in OUTPUTS], name="beam_search", domain="com.microsoft", model_type=1,
        decoder_start_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, early_stopping=int(early_stopping),
        no_repeat_ngram_size=0, vocab_size=cfg.trg_vocab_size, encoder=enc, decoder=dec)
    graph = helper.make_graph(
        [*mask, search], "generate",
        [helper.make_tensor_value_info(t.name, ONNX_TYPES[t.dtype], list(t.shape)) for t in INPUTS],
        [helper.make_tensor_value_info(t.name, ONNX_TYPES[t.dtype], list(t.shape)) for t in OUTPUTS],
        [*constants, *shared])
    opset = next(o.version for o in decoder.opset_import if o.domain in ("", "ai.onnx"))
    model = helper.make_model(graph, ir_version=decoder.ir_version, producer_name="tfm-export",
                              producer_version=__version__,
                              opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    props = {p.key: p.value for p in decoder.metadata_props}
    helper.set_model_props(model, {**props, "tfm_export.graph": GENERATE_FILE.removesuffix(".onnx"),
                                   "tfm_export.early_stopping": str(int(early_stopping))})
    return model
