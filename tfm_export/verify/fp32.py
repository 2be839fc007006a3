"""`tfm-export verify`: PyTorch and ONNX Runtime side by side on random and real inputs."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import torch

from ..artifacts.model_dir import ModelDir
from ..core.batching import pad_batch
from ..core.errors import TfmExportError
from ..core.graph_spec import Graph, all_specs
from ..core.memory import release_file_pages
from ..core.sources import encode_lines
from ..graphs.inputs import random_sources, random_targets
from ..graphs.parity import (
    AGREEMENT_BEAM,
    DEFAULT_TOLERANCE,
    MIN_AGREEMENT,
    SAMPLES,
    STEPS,
    Agreement,
    Reference,
    TensorDiff,
    Tolerance,
    compare_stepwise,
    token_agreement,
)
from ..model import reference_decoding
from ..model.checkpoint import HUGGINGFACE, Checkpoint, checkpoint_files, is_hf_directory
from ..model.loading import load_checkpoint
from ..runtime import decoding
from ..runtime.backends import decoder_openers
from ..runtime.backends.loaders import check_contract_tensors
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
    source = model_dir.manifest.source_checkpoint
    if given is None:
        name = source.file or "its checkpoint"
        raise TfmExportError(f"{directory}: was exported from {name} (sha256 {source.sha256[:12]}...); "
                             "pass it as --checkpoint PATH to compare with it")
    if not vocab and not is_hf_directory(given):
        vocab = model_dir.tokenizer_paths()
    ckpt = load_checkpoint(given, list(vocab))
    if ckpt.sha256 != source.sha256:
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
    want = reference_decodes(ckpt, src, beam_size, max_length, batch_size)
    return [agreement for label, backend in backends.items()
            for agreement in backend_agreement(name, label, ckpt, backend, src, want, beam_size, max_length,
                                               tolerance, batch_size)]


def reference_decodes(ckpt: Checkpoint, src: np.ndarray, beam_size: int, max_length: int,
                      batch_size: int = 32) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The reference's greedy and beam decodes of every row, computed once for every backend held to them."""
    oracle, want_g, want_b = _oracle(ckpt), [], []
    for chunk in _chunks(src, ckpt.config.src_pad_idx, batch_size):
        want_g += oracle(chunk, 1, max_length)
        want_b += oracle(chunk, beam_size, max_length)
    return want_g, want_b


def backend_agreement(name: str, label: str, ckpt: Checkpoint, backend: GraphBackend, src: np.ndarray,
                      want: tuple[list[tuple[int, ...]], list[tuple[int, ...]]], beam_size: int, max_length: int,
                      tolerance: Tolerance = DEFAULT_TOLERANCE, batch_size: int = 32) -> tuple[Agreement, Agreement]:
    """One backend's greedy and beam agreement with the reference's decodes (reference_decodes)."""
    name += (" vs generate()" if ckpt.kind == HUGGINGFACE else "") + label
    greedy, beam = [], []
    for chunk in _chunks(src, ckpt.config.src_pad_idx, batch_size):
        greedy.extend(h.tokens for h in decoding.greedy(backend, chunk, max_length, rules=ckpt.rules))
        beam.extend(h[0].tokens for h in decoding.beam_search_for(ckpt.rules)(
            backend, chunk, beam_size, max_length, rules=ckpt.rules))
    return judged(name, ckpt, src, (greedy, want[0]), (beam, want[1]), beam_size, max_length, tolerance)


def _chunks(src: np.ndarray, pad: int, batch_size: int) -> Iterator[np.ndarray]:
    """Batches of rows, each without its all-padding columns."""
    for start in range(0, len(src), batch_size):
        chunk = src[start:start + batch_size]
        yield chunk[:, :max(1, int((chunk != pad).sum(1).max()))]


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


def graph_backends(directory: Path) -> dict[str, Callable[[], GraphBackend]]:
    """The directory's decoders, each labelled for the report and opened when verify comes to it (one at a time:
    a large model's sessions, one pair at a time): the contract's decoder_step, and decoder_step_search and its
    fused twin (what `tfm-run translate` runs on the CPU) where the directory has them. The directory's files are
    checked here, whole, before the checkpoint is read: a damaged one is its own error."""
    model_dir = ModelDir.read(directory)
    specs = {graph.value: spec for graph, spec in all_specs(model_dir.config).items()}
    for name, path in model_dir.verified_graphs().items():
        if name in specs:
            check_contract_tensors(_GraphTensors(path), specs[name], path)
    return {"" if name == Graph.DECODER_STEP.value else f", {name}": partial(lambda o: o().backend, opens)
            for name, opens in decoder_openers(directory).items()}


class _GraphTensors:
    """A graph file's inputs and outputs as a session lists them (name, shape), read without its weights: the
    loaders' contract check, made for every graph before the checkpoint is read and no session is opened."""

    def __init__(self, path: Path) -> None:
        graph = onnx.load_model(str(path), load_external_data=False).graph
        weights = {init.name for init in graph.initializer}
        self._inputs = [_Tensor.of(v) for v in graph.input if v.name not in weights]
        self._outputs = [_Tensor.of(v) for v in graph.output]

    def get_inputs(self) -> list[_Tensor]:
        return self._inputs

    def get_outputs(self) -> list[_Tensor]:
        return self._outputs


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: list[int | str | None]

    @staticmethod
    def of(value: onnx.ValueInfoProto) -> _Tensor:
        dims = value.type.tensor_type.shape.dim
        return _Tensor(value.name, [d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in dims])


def verify(backends: dict[str, Callable[[], GraphBackend]], ckpt: Checkpoint, texts: Sequence[str] = (),
           samples: int = SAMPLES, steps: int = STEPS, beam_size: int = AGREEMENT_BEAM, max_length: int = 40,
           tolerance: Tolerance = DEFAULT_TOLERANCE, min_agreement: float = MIN_AGREEMENT["fp32"],
           seed: int = 0) -> VerifyReport:
    """backends: graph_backends(directory). PyTorch's side is computed once (its outputs, its decodes), then each
    backend is opened, held to it and let go before the next."""
    cfg = ckpt.config
    report = VerifyReport(tolerance=tolerance, min_agreement=min_agreement)
    src_len, max_length = min(cfg.n_position, 24), min(max_length, cfg.n_position)
    src = random_sources(cfg.src_vocab_size, 4, src_len, seed, cfg.src_pad_idx)
    trg = random_targets(cfg.trg_vocab_size, 4, min(steps, cfg.n_position), seed, cfg.trg_pad_idx)
    random_src = random_sources(cfg.src_vocab_size, samples, src_len, seed + 7, cfg.src_pad_idx)
    inputs = [("random", src, trg, f"{samples} random sources", random_src)]
    if texts:
        real = encode_texts(ckpt, texts)
        real_trg = random_targets(cfg.trg_vocab_size, min(4, len(real)), min(steps, cfg.n_position), seed,
                                  cfg.trg_pad_idx)
        inputs.append(("real", real[:4], real_trg, f"{len(real)} input lines", real))
    wanted = [(kind, Reference.of(ckpt.model, s, t), s, t, name, d,
               reference_decodes(ckpt, d, beam_size, max_length)) for kind, s, t, name, d in inputs]
    release_file_pages(checkpoint_files(ckpt))  # PyTorch's part is done: its mapped weights need not stay
    for label, opener in backends.items():
        backend = opener()
        for kind, reference, s, t, name, decoded, want in wanted:
            report.tensors += [_renamed(d, f"{kind}{label}") for d in compare_stepwise(reference, backend, s, t)]
            report.agreements += backend_agreement(name, label, ckpt, backend, decoded, want, beam_size,
                                                   max_length, tolerance)
        del backend
    return report


def _renamed(diff: TensorDiff, kind: str) -> TensorDiff:
    return TensorDiff(f"{diff.name} [{kind}]", diff.max_abs, diff.max_rel, diff.scale)
