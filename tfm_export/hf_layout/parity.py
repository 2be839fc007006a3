"""The layout's graphs held to a reference the way Hugging Face's runtimes run them: the encoder, then the merged
decoder from an empty past (it computes the cross keys and values) and on with its past fed back, then Optimum's
pair (decoder_model for the first step, decoder_with_past_model after it).

The reference is PyTorch's full-sequence forward where the checkpoint is given (fp32), else the directory's own
encoder.onnx and decoder_step.onnx, which `tfm-export onnx` and `quantize` held to PyTorch and to the fp32 graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..artifacts.model_dir import ModelDir
from ..core.config import ModelConfig
from ..core.errors import TfmExportError
from ..core.graph_spec import (
    ATTENTION_MASK,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LAST_HIDDEN_STATE,
    LOGITS,
    Graph,
    cache_names,
)
from ..core.tokenizer import BOS_ID, EOS_ID, FIRST_TOKEN_ID
from ..graphs.hf_graphs import ENCODER_HIDDEN_STATES
from ..graphs.parity import DEFAULT_TOLERANCE, Reference, TensorDiff, Tolerance
from .view import ENCODER, FIRST_STEP, MERGED, WITH_PAST, graph_file

SOURCE_LENGTHS = (12, 7)  # two sources, the second padded: the mask and the padding are exercised
TARGET_LENGTH = 8  # decoder steps compared: the first (cross keys/values made) and seven with the past fed back
# The layout's graphs are its directory's nodes rewired, so against those they must agree to the last bit but for
# ONNX Runtime's own rounding: sessions open with its graph optimizations off (its int8 fusions would round the
# encoder's and the decoder's copies of a projection differently), and an fp16 graph's MatMuls run in float32
# between casts that its CPU provider places per graph (measured: one fp16 ulp apart at a few positions).
TOLERANCES = {"fp32": DEFAULT_TOLERANCE, "int8": DEFAULT_TOLERANCE, "fp16": Tolerance(atol=1e-3, rtol=4e-3)}


class HfParityError(TfmExportError):
    """A graph of the layout that does not compute what its reference does."""


@dataclass(frozen=True)
class Expected:
    logits: np.ndarray  # (B, T, V)
    encoder: np.ndarray  # (B, S, C)
    cross: np.ndarray  # present.{i}.encoder.*, flat, in the graphs' output order


def sample(cfg: ModelConfig, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(src, trg): framed sources of SOURCE_LENGTHS padded to the longest, and targets starting with <s>."""
    rng = np.random.default_rng(seed)
    width = max(SOURCE_LENGTHS)
    src = np.full((len(SOURCE_LENGTHS), width), cfg.src_pad_idx, np.int64)
    for row, length in enumerate(SOURCE_LENGTHS):
        src[row, :length] = [BOS_ID, *rng.integers(FIRST_TOKEN_ID, cfg.src_vocab_size, length - 2), EOS_ID]
    trg = rng.integers(FIRST_TOKEN_ID, cfg.trg_vocab_size, (len(SOURCE_LENGTHS), TARGET_LENGTH))
    trg[:, 0] = BOS_ID
    return src, trg


def from_pytorch(reference: Reference) -> Expected:
    return Expected(reference.logits, reference.encoder, reference.cross)


def from_directory(model_dir: ModelDir, src: np.ndarray, trg: np.ndarray) -> Expected:
    """The directory's own graphs, the cache fed back step by step as tfm-run's contract backend does."""
    cfg = model_dir.config
    names = cache_names(cfg)
    encoder = _session(model_dir.graph_path(Graph.ENCODER.value))
    encoded = _run(encoder, {INPUT_IDS: src, ATTENTION_MASK: _mask(src, cfg)})
    del encoder  # one graph's weights in memory at a time
    decoder = _session(model_dir.graph_path(Graph.DECODER_STEP.value))
    past = {p: _empty(src, cfg, decoder, p) for p in names.self_inputs}
    past |= {p: encoded[o] for p, o in zip(names.cross_inputs, names.cross_outputs, strict=True)}
    logits = []
    for t in range(trg.shape[1]):
        out = _run(decoder, {INPUT_IDS: trg[:, t:t + 1], ENCODER_ATTENTION_MASK: _mask(src, cfg), **past})
        logits.append(out[LOGITS][:, 0])
        past |= {p: out[o] for p, o in zip(names.self_inputs, names.self_outputs, strict=True)}
    return Expected(np.stack(logits, 1), encoded[LAST_HIDDEN_STATE], _flat(encoded, names.cross_outputs))


def check_view(staging: Path, cfg: ModelConfig, precision: str, want: Expected, src: np.ndarray, trg: np.ndarray
               ) -> list[str]:
    """Each graph against `want`; raises HfParityError naming the first that is off. Returns the report's lines."""
    tolerance = TOLERANCES[precision]
    names = cache_names(cfg)
    mask = _mask(src, cfg)
    hidden = _run(_session(staging / graph_file(ENCODER, precision)), {INPUT_IDS: src, ATTENTION_MASK: mask})
    diffs = [TensorDiff.of(f"{ENCODER} {LAST_HIDDEN_STATE}", hidden[LAST_HIDDEN_STATE], want.encoder)]
    merged = _session(staging / graph_file(MERGED, precision))
    fixed = {ENCODER_ATTENTION_MASK: mask, ENCODER_HIDDEN_STATES: hidden[LAST_HIDDEN_STATE]}
    past = {p: _empty(src, cfg, merged, p) for p in (*names.self_inputs, *names.cross_inputs)}
    steps = []
    for t in range(trg.shape[1]):
        out = _run(merged, {INPUT_IDS: trg[:, t:t + 1], **fixed, **past})
        steps.append(out[LOGITS][:, 0])
        if t == 0:
            diffs.append(TensorDiff.of(f"{MERGED} step 1 present.*.encoder.*", _flat(out, names.cross_outputs),
                                       want.cross))
            diffs.append(TensorDiff.of(f"{MERGED} step 1 logits (empty past)", steps[0], want.logits[:, 0]))
        past = {p: out[o] for p, o in zip((*names.self_inputs, *names.cross_inputs),
                                          (*names.self_outputs, *names.cross_outputs), strict=True)}
    diffs.append(TensorDiff.of(f"{MERGED} steps 2-{trg.shape[1]} logits (past fed back)", np.stack(steps[1:], 1),
                               want.logits[:, 1:]))
    del merged, out, past  # one decoder's weights in memory at a time
    diffs += _optimum_pair(staging, cfg, precision, fixed, trg, want)
    bad = [d for d in diffs if not d.within(tolerance)]
    if bad:
        raise HfParityError(f"{bad[0].name}: max abs difference {bad[0].max_abs:.2e} from the reference, beyond "
                            f"{tolerance.atol:g} + {tolerance.rtol:g} x {bad[0].scale:.3g}")
    return [f"{d.name}: max abs {d.max_abs:.2e}" for d in diffs]


def _optimum_pair(staging: Path, cfg: ModelConfig, precision: str, fixed: dict[str, np.ndarray], trg: np.ndarray,
                  want: Expected) -> list[TensorDiff]:
    names = cache_names(cfg)
    first = _run(_session(staging / graph_file(FIRST_STEP, precision)), {INPUT_IDS: trg[:, :1], **fixed})
    diffs = [TensorDiff.of(f"{FIRST_STEP} logits", first[LOGITS][:, 0], want.logits[:, 0])]
    past = {p: first[o] for p, o in zip((*names.self_inputs, *names.cross_inputs),
                                        (*names.self_outputs, *names.cross_outputs), strict=True)}
    del first
    with_past = _session(staging / graph_file(WITH_PAST, precision))
    steps = []
    for t in range(1, trg.shape[1]):
        out = _run(with_past, {INPUT_IDS: trg[:, t:t + 1], ENCODER_ATTENTION_MASK: fixed[ENCODER_ATTENTION_MASK],
                               **past})
        steps.append(out[LOGITS][:, 0])
        past |= {p: out[o] for p, o in zip(names.self_inputs, names.self_outputs, strict=True)}
    diffs.append(TensorDiff.of(f"{WITH_PAST} steps 2-{trg.shape[1]} logits", np.stack(steps, 1), want.logits[:, 1:]))
    return diffs


def _flat(outputs: dict[str, np.ndarray], names: tuple[str, ...]) -> np.ndarray:
    """The named outputs raveled one after another (the reference's cross keys and values are so kept)."""
    return np.concatenate([outputs[name].ravel() for name in names])


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # errors only: its notes on a graph's unused constants are not the user's
    # the weights read where they lie in the file (no packed copies, no arena): a large model's graphs, one at a
    # time, cost their mapped pages only
    options.enable_cpu_mem_arena = False
    options.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _run(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    inputs = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in inputs}), strict=True))


def _mask(src: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return (src != cfg.src_pad_idx).astype(np.int64)


def _empty(src: np.ndarray, cfg: ModelConfig, session: ort.InferenceSession, name: str) -> np.ndarray:
    """A zero-length past of the input's type, as both libraries make it."""
    kind = next(i.type for i in session.get_inputs() if i.name == name)
    dtype = np.float16 if "float16" in kind else np.float32
    return np.zeros((src.shape[0], cfg.n_head, 0, cfg.d_k), dtype)
