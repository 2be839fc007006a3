"""generate.onnx: the whole search in one graph, ONNX Runtime's com.microsoft BeamSearch op (model_type 1,
encoder-decoder) over subgraphs made from encoder.onnx and decoder_step.onnx.

The op fixes the names, order and dtypes of its subgraphs' inputs and outputs; this module says how the
graph contract's tensors map onto them, and what the graph takes and returns. graphs.generate builds the
graph from it, runtime.backends.generate feeds it, docs/graph-contract.md documents it.
"""

from __future__ import annotations

from .config import ModelConfig
from .graph_spec import (
    ATTENTION_MASK,
    BATCH,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    SRC_LEN,
    TensorSpec,
    cache_names,
)

GENERATE_FILE = "generate.onnx"
GENERATE = GENERATE_FILE.removesuffix(".onnx")  # its manifest entry's key
OP = "com.microsoft.BeamSearch"
OP_MAX_LENGTH = 4096  # the op refuses a longer max_length (which counts the start token)
MIN_ONNXRUNTIME = (1, 22)  # the first release whose op takes an encoder subgraph of 2 inputs (1.21.1 refuses it)
SEQUENCES_LEN = "max_length"  # the sequences output is padded to the max_length input

INPUTS = (TensorSpec(INPUT_IDS, "int32", (BATCH, SRC_LEN)),
          TensorSpec("max_length", "int32", (1,)),
          TensorSpec("min_length", "int32", (1,)),
          TensorSpec("num_beams", "int32", (1,)),
          TensorSpec("num_return_sequences", "int32", (1,)),
          TensorSpec("length_penalty", "float32", (1,)))
OUTPUTS = (TensorSpec("sequences", "int32", (BATCH, "num_return_sequences", SEQUENCES_LEN)),
           TensorSpec("sequences_scores", "float32", (BATCH, "num_return_sequences")))

ENCODER_INPUTS = {INPUT_IDS: "encoder_input_ids", ATTENTION_MASK: ENCODER_ATTENTION_MASK}
DECODER_INPUTS = {INPUT_IDS: INPUT_IDS, ENCODER_ATTENTION_MASK: ENCODER_ATTENTION_MASK}


def op_name(contract_name: str) -> str:
    """A cache tensor's name in the op's subgraphs: past_key_values.{i}.decoder.key -> past_key_self_{i},
    present.{i}.encoder.value -> present_value_cross_{i}, ..."""
    prefix, layer, side, role = contract_name.split(".")
    kind = "past" if prefix == "past_key_values" else "present"
    return f"{kind}_{role}_{'self' if side == 'decoder' else 'cross'}_{layer}"


def encoder_outputs(cfg: ModelConfig) -> list[str]:
    """The encoder subgraph's outputs, in order: each layer's cross-attention key and value."""
    return [op_name(n) for n in cache_names(cfg).cross_outputs]


def decoder_inputs(cfg: ModelConfig) -> list[str]:
    """The decoder subgraph's inputs, in order: ids, source mask, every self-attention past, every cross one."""
    names = cache_names(cfg)
    return [*DECODER_INPUTS.values(), *(op_name(n) for n in (*names.self_inputs, *names.cross_inputs))]


def decoder_outputs(cfg: ModelConfig) -> list[str]:
    return [LOGITS, *(op_name(n) for n in cache_names(cfg).self_outputs)]


def op_lengths(max_length: int, min_length: int = 0) -> tuple[int, int]:
    """The op's max_length/min_length for at most `max_length` generated tokens (</s> included) and </s> barred
    for the first `min_length`: the op counts the decoder start token <s> in both."""
    return max_length + 1, min_length + 1
