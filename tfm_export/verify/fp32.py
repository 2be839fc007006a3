"""`tfm-export verify`: PyTorch and ONNX Runtime side by side on random and real inputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..artifacts.model_dir import ModelDir, tokenizer_paths
from ..core.batching import pad_batch
from ..core.errors import TfmExportError
from ..core.graph_spec import Graph
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
from ..model.checkpoint import HUGGINGFACE, Checkpoint, is_hf_directory
from ..model.loading import load_checkpoint
from ..runtime import decoding
from ..runtime.backends import graph_decoders
from ..runtime.step import GraphBackend
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
        return bad + [f"{a.name}: {a.summary}, {a.total - a.identical - a.ties} diverging" for a in self.agreements
                      if a.agreeing < self.min_agreement]


def checkpoint_for(directory: Path, given: Path | None, vocab: Sequence[Path]) -> Checkpoint:
    """The checkpoint the directory was exported from (its sha256 checked). The manifest records its name,
    not where it was: the user names it. Without --vocab it is read with the directory's tokenizers, which
    the export wrote from it (a seed checkpoint carries none)."""
    model_dir = ModelDir.read(directory)
    model_dir.vocabulary()  # the directory must be whole, its tokenizer included
    source = model_dir.manifest["source_checkpoint"]
    if given is None:
        name = source.get("file") or "its checkpoint"
        raise TfmExportError(f"{directory}: was exported from {name} (sha256 {str(source['sha256'])[:12]}...); "
                             "pass it as --checkpoint PATH to compare with it")
    if not vocab and not is_hf_directory(given):
        vocab = tokenizer_paths(directory, model_dir.manifest)
    ckpt = load_checkpoint(given, list(vocab))
    if ckpt.sha256 != source["sha256"]:
        raise TfmExportError(f"{given}: is not the checkpoint {directory} was exported from (sha256 differs); "
                             "pass the right --checkpoint")
    return ckpt


def encode_texts(ckpt: Checkpoint, texts: Sequence[str]) -> np.ndarray:
    rows = encode_lines(ckpt.vocab.source, texts, ckpt.config.n_position, "--input ")
    if not rows:
        raise TfmExportError("--input has no non-empty lines to compare on")
    return pad_batch(list(rows.values()), ckpt.config.src_pad_idx)


def decode_agreement(name: str, ckpt: Checkpoint, backends: dict[str, GraphBackend], src: np.ndarray,
                     beam_size: int, max_length: int, tolerance: Tolerance = DEFAULT_TOLERANCE,
                     batch_size: int = 32) -> list[Agreement]:
    """Greedy and beam decodes of every backend (label -> backend) against the reference: the reference
    decoders, or generate() for a Hugging Face model (decoded under its token_rules and beam rule). A decode
    that differs only at a near-tie (near_tie) is counted as such, not as a divergence."""
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
    return [agreement for label, (greedy, beam) in got.items()
            for agreement in judged(f"{name}{label}", ckpt, src, (greedy, want_g), (beam, want_b), beam_size,
                                    max_length, tolerance)]


Decodes = tuple[list[tuple[int, ...]], list[tuple[int, ...]]]  # (a backend's, the reference's), row by row


def judged(name: str, ckpt: Checkpoint, src: np.ndarray, greedy: Decodes, beam: Decodes, beam_size: int,
           max_length: int, tolerance: Tolerance) -> tuple[Agreement, Agreement]:
    """The greedy and the beam agreement, each differing decode judged by its own rule (near_tie)."""
    def ties(decodes: Decodes, is_greedy: bool) -> Callable[[int], bool]:
        mine, theirs = decodes
        return lambda row: near_tie(ckpt, src[row], mine[row], theirs[row], is_greedy, max_length, tolerance)
    return (token_agreement(f"greedy, {name}", *greedy, ties(greedy, True)),
            token_agreement(f"beam {beam_size}, {name}", *beam, ties(beam, False)))


def near_tie(ckpt: Checkpoint, src: np.ndarray, got: tuple[int, ...], want: tuple[int, ...], greedy: bool,
             max_length: int, tolerance: Tolerance) -> bool:
    """Whether a decode that differs from the reference's does so where the reference itself cannot tell
    within the tolerance the graphs are held to, so that graphs within it may resolve it either way. Greedy:
    at the first differing step, the reference's logits of the two tokens are within the tolerance of each
    other. Beam: the reference scores the output (per token) no worse than its own, within the tolerance."""
    import torch
    got, want = _with_eos(got, ckpt.rules.eos, max_length), _with_eos(want, ckpt.rules.eos, max_length)
    with torch.no_grad():
        if greedy:
            step = next(i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w)
            logits = _logits(ckpt, src, want[:step + 1])[step]
            return abs(float(logits[want[step]] - logits[got[step]])) <= _bound(logits, tolerance)
        mine, theirs = _logits(ckpt, src, got), _logits(ckpt, src, want)
        bound = _bound(torch.cat([mine, theirs]), tolerance)
        return _mean_logprob(mine, got) >= _mean_logprob(theirs, want) - bound


def _with_eos(tokens: tuple[int, ...], eos: int, max_length: int) -> tuple[int, ...]:
    """A decode as the tokens it chose: with its </s>, unless it was cut at max_length."""
    return tokens + (eos,) if len(tokens) < max_length else tokens


def _logits(ckpt: Checkpoint, src: np.ndarray, tokens: tuple[int, ...]):
    """The reference's logits for each of `tokens`, teacher-forced after the start token: (len(tokens), V)."""
    import torch
    trg = torch.tensor([[ckpt.rules.start, *tokens[:-1]]])
    return ckpt.model(torch.from_numpy(src[None]), trg)[0].float()


def _bound(logits, tolerance: Tolerance) -> float:
    return tolerance.atol + tolerance.rtol * float(logits.abs().max())


def _mean_logprob(logits, tokens: tuple[int, ...]) -> float:
    import torch
    logp = torch.log_softmax(logits, dim=-1)
    return float(logp[torch.arange(len(tokens)), torch.tensor(tokens)].mean())


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
    return {"" if name == Graph.DECODER_STEP.value else f", {name}": backend
            for name, backend in graph_decoders(directory).items()}


def verify(backends: dict[str, GraphBackend], ckpt: Checkpoint, texts: Sequence[str] = (), samples: int = SAMPLES,
           steps: int = STEPS, beam_size: int = AGREEMENT_BEAM, max_length: int = 40,
           tolerance: Tolerance = DEFAULT_TOLERANCE, min_agreement: float = MIN_AGREEMENT["fp32"],
           seed: int = 0) -> VerifyReport:
    """backends: graph_backends(directory), opened (and so checked) before the checkpoint is read."""
    cfg = ckpt.config
    report = VerifyReport(tolerance=tolerance, min_agreement=min_agreement)
    src_len = min(cfg.n_position, 24)
    src = random_sources(cfg.src_vocab_size, 4, src_len, seed, cfg.src_pad_idx)
    trg = random_targets(cfg.trg_vocab_size, 4, min(steps, cfg.n_position), seed, cfg.trg_pad_idx)
    for label, backend in backends.items():
        report.tensors += [_renamed(d, f"random{label}") for d in compare_stepwise(ckpt.model, backend, src, trg)]
    max_length = min(max_length, cfg.n_position)
    random_src = random_sources(cfg.src_vocab_size, samples, src_len, seed + 7, cfg.src_pad_idx)
    report.agreements += decode_agreement(f"{samples} random sources", ckpt, backends, random_src, beam_size,
                                          max_length, tolerance)
    if texts:
        real = encode_texts(ckpt, texts)
        trg = random_targets(cfg.trg_vocab_size, min(4, len(real)), min(steps, cfg.n_position), seed, cfg.trg_pad_idx)
        for label, backend in backends.items():
            report.tensors += [_renamed(d, f"real{label}") for d in compare_stepwise(ckpt.model, backend, real[:4],
                                                                                      trg)]
        report.agreements += decode_agreement(f"{len(real)} input lines", ckpt, backends, real, beam_size, max_length,
                                              tolerance)
    return report


def _renamed(diff: TensorDiff, kind: str) -> TensorDiff:
    return TensorDiff(f"{diff.name} [{kind}]", diff.max_abs, diff.max_rel, diff.scale)
