"""One description per exported graph: names, dtypes and axis symbols of every input and output.

The exporter, the runtime's buffers, the TensorRT profiles, the manifest, `inspect` and the docs
(docs/graph-contract.md) all read these, so the graph contract lives in exactly one place. Names
follow Hugging Face Optimum.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from .config import ModelConfig

SUPPORTED_OPSETS = (17, 18)
DEFAULT_OPSET = 17  # TensorRT 8.6 (JetPack 6.0) parses opsets up to 17; LayerNormalization is one op from 17

BATCH = "batch_size"
SRC_LEN = "encoder_sequence_length"
NEW_LEN = "decoder_sequence_length"
PAST_LEN = "past_decoder_sequence_length"
TOTAL_LEN = "past_decoder_sequence_length + decoder_sequence_length"
CAPACITY = "cache_capacity"  # positions a caller-owned cache buffer holds (decoder_step_search)
SOURCES = "source_batch_size"  # decoder_step_search: sources; batch_size rows are an equal group per source
# the contract's tensor names besides the cache's (cache_names)
INPUT_IDS, ATTENTION_MASK, LAST_HIDDEN_STATE = "input_ids", "attention_mask", "last_hidden_state"  # the encoder's
ENCODER_ATTENTION_MASK, LOGITS = "encoder_attention_mask", "logits"  # the decoder's, with INPUT_IDS
CACHE_LENGTH = "cache_length"  # decoder_step_search: the positions its cache buffers already hold
SEARCH_BEAMS = 8  # the widest beam decoder_step_search's own candidates serve (K = 2 x beams); wider read its logits
# decoder_step_search's decoding-rule inputs: an additive (vocab,) float32 bias (0, or -inf for a banned id and
# for </s> before the minimum length) and the id forced at this step (-1: none; forced, it gets log-p 0)
TOKEN_BIAS, FORCED_TOKEN = "token_bias", "forced_token"
# decoder_step_search_fused's GroupQueryAttention takes the filled positions after the step (cache_length + 1) as
# an int32 scalar in host memory (its CUDA kernel reads it there): the runtime, which knows it, feeds it, so a GPU
# session copies nothing from the device for it
TOTAL_LENGTH = "total_sequence_length"
TOP_LOGPROBS, TOP_IDS = "top_logprobs", "top_ids"  # per row its K best (log-probability, id), best first
FUSED_HEAD_MULTIPLE = 8  # ONNX Runtime's CPU GroupQueryAttention runs only head sizes that are multiples of this
FUSED_MIN_ONNXRUNTIME = (1, 21)  # 1.20 ignores MultiHeadAttention's key padding mask (a padded source's logits
# off by 0.04 on a tiny model; 1.21 and later match PyTorch to 1e-7)
RETIRED_GRAPHS = ("decoder_step_buffered", "decoder_step_fused")  # optional graphs older exports carry: hashed,
# never run (a runtime that ignores optional graphs loses only speed)


class Graph(str, Enum):
    """Every graph a model directory may hold: the contract's two (ENCODER, DECODER_STEP), which every runtime
    reads, and the optional step graphs, which a runtime that ignores them loses only speed by. What differs
    between them is carried by their GraphSpec (optional, shares_table, capturable, simplified)."""

    ENCODER = "encoder"
    DECODER_STEP = "decoder_step"
    # One token per row and call, with the search's reduction at its end and the cache in caller-owned buffers
    # of fixed capacity written in place (graphs.buffer_cache.BufferCache): ONNX Runtime and TensorRT runtimes decode
    # with it, embedders keep the contract's decoder_step.
    DECODER_STEP_SEARCH = "decoder_step_search"
    # decoder_step_search's maths and outputs with its attention in ONNX Runtime's kernels (com.microsoft
    # GroupQueryAttention writing the buffers itself, MultiHeadAttention over the source), and one more input,
    # TOTAL_LENGTH: what tfm-run runs on the CPU where the directory has it, in fp32; fp16 directories carry it for
    # CUDA; never TensorRT's (graphs.buffer_cache.FusedBufferCache).
    DECODER_STEP_SEARCH_FUSED = "decoder_step_search_fused"

    @property
    def filename(self) -> str:
        return f"{self.value}.onnx"

    @property
    def standard_ops(self) -> bool:
        """Whether the graph holds standard ONNX operators only (any ONNX runtime, TensorRT, the converters)."""
        return self is not Graph.DECODER_STEP_SEARCH_FUSED


CONTRACT_GRAPHS = (Graph.ENCODER, Graph.DECODER_STEP)  # the graphs every model directory holds
OPTIONAL_GRAPHS = tuple(g for g in Graph if g not in CONTRACT_GRAPHS)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # "int64" or "float32" (fp16 graphs may change float outputs)
    shape: tuple[str | int, ...]  # axis symbols, or fixed sizes


@dataclass(frozen=True)
class GraphSpec:
    graph: Graph
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # a directory may lack it (a runtime without it loses speed only); the contract's graphs are never optional
    optional: bool = False
    # keeps the encoder's very tied table (its Gathers read the table as stored, its projection a Transpose of it),
    # so that one copy serves every session: saved in the encoder's data file, never quantized apart from it
    shares_table: bool = False
    capturable: bool = False  # its runs may be captured as CUDA graphs (fixed addresses: caller-owned buffers)
    simplified: bool = False  # the export's node-removing rewrites apply (graphs.simplify); never the contract's

    def to_dict(self) -> dict:
        def tensors(specs: tuple[TensorSpec, ...]) -> list[dict]:
            return [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in specs]
        return {"file": self.graph.filename, "inputs": tensors(self.inputs), "outputs": tensors(self.outputs)}


def cache_name(prefix: str, layer: int, side: str, role: str) -> str:
    """prefix: 'past_key_values' (input) or 'present' (output); side: 'decoder'|'encoder'; role: 'key'|'value'."""
    return f"{prefix}.{layer}.{side}.{role}"


@dataclass(frozen=True)
class CacheNames:
    """The flat cache tensor names every backend feeds and reads, layer by layer, key before value."""

    self_inputs: tuple[str, ...]  # past_key_values.{i}.decoder.*
    self_outputs: tuple[str, ...]  # present.{i}.decoder.*
    cross_inputs: tuple[str, ...]  # past_key_values.{i}.encoder.*
    cross_outputs: tuple[str, ...]  # present.{i}.encoder.* (encoder outputs)


def cache_names(cfg: ModelConfig) -> CacheNames:
    def names(prefix: str, side: str) -> tuple[str, ...]:
        return tuple(cache_name(prefix, i, side, role) for i in range(cfg.n_layers) for role in ("key", "value"))
    return CacheNames(names("past_key_values", "decoder"), names("present", "decoder"),
                      names("past_key_values", "encoder"), names("present", "encoder"))


def cache_head_sizes(cfg: ModelConfig) -> list[int]:
    """Per flat cache tensor (in CacheNames order): its last axis, d_k for keys and d_v for values."""
    return [cfg.d_k, cfg.d_v] * cfg.n_layers


def _cache(names: tuple[str, ...], cfg: ModelConfig, length: str, batch: str = BATCH) -> list[TensorSpec]:
    return [TensorSpec(name, "float32", (batch, cfg.n_head, length, size))
            for name, size in zip(names, cache_head_sizes(cfg), strict=True)]


def encoder_spec(cfg: ModelConfig) -> GraphSpec:
    return GraphSpec(
        Graph.ENCODER,
        inputs=(TensorSpec(INPUT_IDS, "int64", (BATCH, SRC_LEN)),
                TensorSpec(ATTENTION_MASK, "int64", (BATCH, SRC_LEN))),
        outputs=(TensorSpec(LAST_HIDDEN_STATE, "float32", (BATCH, SRC_LEN, cfg.d_model)),
                 *_cache(cache_names(cfg).cross_outputs, cfg, SRC_LEN)),
    )


def past_inputs(cfg: ModelConfig, self_length: str = PAST_LEN, sources: str = BATCH) -> list[TensorSpec]:
    """Per layer: decoder key, decoder value, encoder key, encoder value (the graph's input order)."""
    names = cache_names(cfg)
    dec, enc = _cache(names.self_inputs, cfg, self_length), _cache(names.cross_inputs, cfg, SRC_LEN, sources)
    return [spec for i in range(cfg.n_layers) for spec in (*dec[2 * i:2 * i + 2], *enc[2 * i:2 * i + 2])]


def decoder_step_spec(cfg: ModelConfig) -> GraphSpec:
    return GraphSpec(
        Graph.DECODER_STEP,
        inputs=(TensorSpec(INPUT_IDS, "int64", (BATCH, NEW_LEN)),
                TensorSpec(ENCODER_ATTENTION_MASK, "int64", (BATCH, SRC_LEN)),
                *past_inputs(cfg)),
        outputs=(TensorSpec(LOGITS, "float32", (BATCH, NEW_LEN, cfg.trg_vocab_size)),
                 *_cache(cache_names(cfg).self_outputs, cfg, TOTAL_LEN)),
    )


def search_top_k(cfg: ModelConfig) -> int:
    """K of decoder_step_search's TopK: a constant of the graph (TensorRT takes no run-time K)."""
    return min(2 * SEARCH_BEAMS, cfg.trg_vocab_size)


def search_step_spec(cfg: ModelConfig, graph: Graph = Graph.DECODER_STEP_SEARCH) -> GraphSpec:
    """decoder_step_search: `cache_length` (int64 scalar) positions of each buffer are filled; the new token's
    keys/values are written at that position and `present.*` are the buffers so written (bound to the past
    inputs' memory, the write lands in place; buffer positions beyond it are hidden but must be finite). The
    encoder's mask and keys/values come once per source (source_batch_size): the batch_size rows are
    source_batch_size equal consecutive groups (a source's beams), each attending to its own source. Outputs:
    the logits, and per row the K best log-probabilities after the decoding rules (TOKEN_BIAS, FORCED_TOKEN)
    with their ids, equal logits to the lower id. The fused twin also takes TOTAL_LENGTH, cache_length + 1, from the
    host."""
    k, names = search_top_k(cfg), cache_names(cfg)
    return GraphSpec(
        graph,
        inputs=(TensorSpec(INPUT_IDS, "int64", (BATCH, 1)),
                TensorSpec(ENCODER_ATTENTION_MASK, "int64", (SOURCES, SRC_LEN)),
                TensorSpec(CACHE_LENGTH, "int64", ()),
                TensorSpec(TOKEN_BIAS, "float32", (cfg.trg_vocab_size,)),
                TensorSpec(FORCED_TOKEN, "int64", ()),
                *(() if graph.standard_ops else (TensorSpec(TOTAL_LENGTH, "int32", ()),)),
                *past_inputs(cfg, CAPACITY, SOURCES)),
        outputs=(TensorSpec(LOGITS, "float32", (BATCH, 1, cfg.trg_vocab_size)),
                 TensorSpec(TOP_LOGPROBS, "float32", (BATCH, k)),
                 TensorSpec(TOP_IDS, "int64", (BATCH, k)),
                 *_cache(names.self_outputs, cfg, CAPACITY)),
        optional=True, shares_table=True, capturable=True, simplified=True,
    )


def contract_specs(cfg: ModelConfig) -> dict[Graph, GraphSpec]:
    return {Graph.ENCODER: encoder_spec(cfg), Graph.DECODER_STEP: decoder_step_spec(cfg)}


def optional_specs(cfg: ModelConfig) -> dict[Graph, GraphSpec]:
    """The optional graphs a model gets: every architecture gets decoder_step_search; its fused twin where ONNX
    Runtime's kernels compute the same attention (equal key and value head sizes that its CPU GroupQueryAttention
    runs, no relative position bias, which it has no input for)."""
    specs = {Graph.DECODER_STEP_SEARCH: search_step_spec(cfg)}
    if cfg.d_k == cfg.d_v and cfg.d_k % FUSED_HEAD_MULTIPLE == 0 and cfg.positions != "relative":
        fused = Graph.DECODER_STEP_SEARCH_FUSED
        specs[fused] = search_step_spec(cfg, fused)
    return specs


def all_specs(cfg: ModelConfig) -> dict[Graph, GraphSpec]:
    """The contract's graphs and the optional ones this model gets."""
    return {**contract_specs(cfg), **optional_specs(cfg)}


def tensorrt_specs(cfg: ModelConfig, listed: Iterable[str]) -> dict[Graph, GraphSpec]:
    """The specs of the graphs among `listed` (a directory's graph names) that TensorRT takes: standard ONNX
    operators only. Every TensorRT check and build iterates over these, so a new graph is checked once it is listed."""
    listed = set(listed)
    return {graph: spec for graph, spec in all_specs(cfg).items()
            if graph.value in listed and graph.standard_ops}
