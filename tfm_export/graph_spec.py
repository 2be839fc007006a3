"""One description per exported graph: names, dtypes and axis symbols of every input and output.

The exporter, the runtime's buffers, the manifest, `inspect` and the docs all read these, so the
contract in ../shared/docs/design.md lives in exactly one place. Names follow Hugging Face Optimum.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .config import ModelConfig

BATCH = "batch_size"
SRC_LEN = "encoder_sequence_length"
NEW_LEN = "decoder_sequence_length"
PAST_LEN = "past_decoder_sequence_length"
TOTAL_LEN = "past_decoder_sequence_length + decoder_sequence_length"


class Graph(str, Enum):
    ENCODER = "encoder"
    DECODER_STEP = "decoder_step"

    @property
    def filename(self) -> str:
        return f"{self.value}.onnx"


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

    def to_dict(self) -> dict:
        def tensors(specs: tuple[TensorSpec, ...]) -> list[dict]:
            return [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in specs]
        return {"file": self.graph.filename, "inputs": tensors(self.inputs), "outputs": tensors(self.outputs)}


def cache_name(prefix: str, layer: int, side: str, role: str) -> str:
    """prefix: 'past_key_values' (input) or 'present' (output); side: 'decoder'|'encoder'; role: 'key'|'value'."""
    return f"{prefix}.{layer}.{side}.{role}"


def _cache(prefix: str, cfg: ModelConfig, side: str, length: str) -> list[TensorSpec]:
    return [TensorSpec(cache_name(prefix, i, side, role), "float32", (BATCH, cfg.n_head, length, size))
            for i in range(cfg.n_layers) for role, size in (("key", cfg.d_k), ("value", cfg.d_v))]


def encoder_spec(cfg: ModelConfig) -> GraphSpec:
    return GraphSpec(
        Graph.ENCODER,
        inputs=(TensorSpec("input_ids", "int64", (BATCH, SRC_LEN)),
                TensorSpec("attention_mask", "int64", (BATCH, SRC_LEN))),
        outputs=(TensorSpec("last_hidden_state", "float32", (BATCH, SRC_LEN, cfg.d_model)),
                 *_cache("present", cfg, "encoder", SRC_LEN)),
    )


def past_inputs(cfg: ModelConfig) -> list[TensorSpec]:
    """Per layer: decoder key, decoder value, encoder key, encoder value (the graph's input order)."""
    dec = _cache("past_key_values", cfg, "decoder", PAST_LEN)
    enc = _cache("past_key_values", cfg, "encoder", SRC_LEN)
    return [spec for i in range(cfg.n_layers) for spec in (*dec[2 * i:2 * i + 2], *enc[2 * i:2 * i + 2])]


def decoder_step_spec(cfg: ModelConfig) -> GraphSpec:
    return GraphSpec(
        Graph.DECODER_STEP,
        inputs=(TensorSpec("input_ids", "int64", (BATCH, NEW_LEN)),
                TensorSpec("encoder_attention_mask", "int64", (BATCH, SRC_LEN)),
                *past_inputs(cfg)),
        outputs=(TensorSpec("logits", "float32", (BATCH, NEW_LEN, cfg.trg_vocab_size)),
                 *_cache("present", cfg, "decoder", TOTAL_LEN)),
    )


def graph_specs(cfg: ModelConfig) -> dict[Graph, GraphSpec]:
    return {Graph.ENCODER: encoder_spec(cfg), Graph.DECODER_STEP: decoder_step_spec(cfg)}
