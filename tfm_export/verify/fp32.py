"""`tfm-export verify`: PyTorch and ONNX Runtime side by side on random and real inputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..artifacts.model_dir import load_vocabulary, read_manifest
from ..core.batching import pad_batch
from ..core.errors import TfmExportError
from ..core.sources import encode_lines
from ..graphs.inputs import random_sources, random_targets
from ..graphs.parity import (
    AGREEMENT_BEAM,
    DEFAULT_TOLERANCE,
    MIN_AGREEMENT,
    SAMPLES,
    STEPS,
    Agreement,
    TensorDiff,
    Tolerance,
    compare_stepwise,
    token_agreement,
)
from ..model import reference_decoding
from ..model.checkpoint import HUGGINGFACE, Checkpoint, is_hf_directory, load_checkpoint
from ..runtime import decoding
from ..runtime.decoding import GraphBackend
from ..runtime.ort_backend import OrtBackend
from ..runtime.ort_search import FUSED, SEARCH, OrtSearchBackend
from ..runtime.session import runs_fused_graphs
from .hf_generate import HfGenerate


@dataclass
class VerifyReport:
    tensors: list[TensorDiff] = field(default_factory=list)
    agreements: list[Agreement] = field(default_factory=list)
    tolerance: Tolerance = DEFAULT_TOLERANCE
    min_agreement: float = MIN_AGREEMENT["fp32"]

    @property
    def failures(self) -> list[str]:
        bad = [f"{d.name}: max abs {d.max_abs:.2e}" for d in self.tensors if not d.within(self.tolerance)]
        return bad + [f"{a.name}: {a.identical}/{a.total} identical" for a in self.agreements
                      if a.rate < self.min_agreement]


def checkpoint_for(directory: Path, given: Path | None, vocab: Sequence[Path]) -> Checkpoint:
    """The checkpoint to compare with: the one given, else the one the manifest says was exported."""
    manifest = read_manifest(directory)
    load_vocabulary(directory, manifest)  # the directory must be whole, its tokenizer included
    source = manifest["source_checkpoint"]
    path = given or Path(source.get("path", ""))
    if not given and not (path.is_file() or is_hf_directory(path)):
        raise TfmExportError(f"{directory}: the exported checkpoint {source.get('path')} is not here; "
                             "pass --checkpoint")
    ckpt = load_checkpoint(path, list(vocab) or None)
    if ckpt.sha256 != source["sha256"]:
        raise TfmExportError(f"{path}: is not the checkpoint {directory} was exported from (sha256 differs); "
                             "pass the right --checkpoint")
    return ckpt


def encode_texts(ckpt: Checkpoint, texts: Sequence[str]) -> np.ndarray:
    rows = encode_lines(ckpt.vocab.source, texts, ckpt.config.n_position, "--input ")
    if not rows:
        raise TfmExportError("--input has no non-empty lines to compare on")
    return pad_batch(list(rows.values()), ckpt.config.src_pad_idx)


def decode_agreement(name: str, ckpt: Checkpoint, backends: dict[str, GraphBackend], src: np.ndarray,
                     beam_size: int, max_length: int, batch_size: int = 32) -> list[Agreement]:
    """Greedy and beam decodes of every backend (label -> backend) against the reference: the reference
    decoders, or generate() for a Hugging Face model (decoded under its token_rules and beam rule)."""
    oracle = _oracle(ckpt)
    name += " vs generate()" if ckpt.kind == HUGGINGFACE else ""
    want_g, want_b = [], []
    got = {label: ([], []) for label in backends}
    pad = ckpt.config.src_pad_idx
    for start in range(0, len(src), batch_size):
        chunk = src[start:start + batch_size]
        chunk = chunk[:, :max(1, int((chunk != pad).sum(1).max()))]  # drop all-padding columns
        want_g += oracle(chunk, 1, max_length)
        want_b += oracle(chunk, beam_size, max_length)
        for label, backend in backends.items():
            got[label][0].extend(h.tokens for h in decoding.greedy(backend, chunk, max_length, rules=ckpt.rules))
            got[label][1].extend(h[0].tokens for h in decoding.beam_search_for(ckpt.rules)(
                backend, chunk, beam_size, max_length, rules=ckpt.rules))
    return [agreement for label, (greedy, beam) in got.items() for agreement in
            (token_agreement(f"greedy, {name}{label}", greedy, want_g),
             token_agreement(f"beam {beam_size}, {name}{label}", beam, want_b))]


def _oracle(ckpt: Checkpoint) -> Callable[[np.ndarray, int, int], list[tuple[int, ...]]]:
    """(src, beam size, max length) -> the reference's tokens per row."""
    if ckpt.kind == HUGGINGFACE:
        generate = HfGenerate(ckpt.path)
        return lambda src, beam, length: generate(src, ckpt.rules, beam, length, 1.0)

    def reference(src: np.ndarray, beam: int, length: int) -> list[tuple[int, ...]]:
        if beam == 1:
            return [h.tokens for h in reference_decoding.greedy_decode(ckpt.model, torch.from_numpy(src), length)]
        return [h[0].tokens for h in reference_decoding.beam_search(ckpt.model, torch.from_numpy(src), beam, length)]
    return reference


def graph_backends(directory: Path) -> dict[str, GraphBackend]:
    """The directory's decoders, each labelled for the report: the contract's decoder_step, and
    decoder_step_search and its fused twin (what `tfm-run translate` runs on the CPU) where the directory has them."""
    backends: dict[str, GraphBackend] = {"": OrtBackend.open(directory)}
    for graph in (SEARCH, FUSED):
        if backends[""].model_dir.has(graph) and (graph is SEARCH or runs_fused_graphs()):
            backends[f", {graph.value}"] = OrtSearchBackend.from_dir(backends[""].model_dir, graph=graph)
    return backends


def verify(directory: Path, ckpt: Checkpoint, texts: Sequence[str] = (), samples: int = SAMPLES, steps: int = STEPS,
           beam_size: int = AGREEMENT_BEAM, max_length: int = 40, tolerance: Tolerance = DEFAULT_TOLERANCE,
           min_agreement: float = MIN_AGREEMENT["fp32"], seed: int = 0) -> VerifyReport:
    cfg = ckpt.config
    backends = graph_backends(directory)
    report = VerifyReport(tolerance=tolerance, min_agreement=min_agreement)
    src_len = min(cfg.n_position, 24)
    src = random_sources(cfg.src_vocab_size, 4, src_len, seed, cfg.src_pad_idx)
    trg = random_targets(cfg.trg_vocab_size, 4, min(steps, cfg.n_position), seed, cfg.trg_pad_idx)
    for label, backend in backends.items():
        report.tensors += [_renamed(d, f"random{label}") for d in compare_stepwise(ckpt.model, backend, src, trg)]
    max_length = min(max_length, cfg.n_position)
    random_src = random_sources(cfg.src_vocab_size, samples, src_len, seed + 7, cfg.src_pad_idx)
    report.agreements += decode_agreement(f"{samples} random sources", ckpt, backends, random_src, beam_size,
                                          max_length)
    if texts:
        real = encode_texts(ckpt, texts)
        trg = random_targets(cfg.trg_vocab_size, min(4, len(real)), min(steps, cfg.n_position), seed, cfg.trg_pad_idx)
        for label, backend in backends.items():
            report.tensors += [_renamed(d, f"real{label}") for d in compare_stepwise(ckpt.model, backend, real[:4],
                                                                                      trg)]
        report.agreements += decode_agreement(f"{len(real)} input lines", ckpt, backends, real, beam_size, max_length)
    return report


def _renamed(diff: TensorDiff, kind: str) -> TensorDiff:
    return TensorDiff(f"{diff.name} [{kind}]", diff.max_abs, diff.max_rel, diff.scale)
