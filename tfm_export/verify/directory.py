"""`tfm-export verify` on any model directory: fp32 graphs against PyTorch, fp16/int8 graphs against their
fp32 parent. One request type for both, so the command line only parses and prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..artifacts.model_dir import ModelDir
from ..core.errors import TfmExportError
from ..core.sources import read_text_lines
from ..graphs.parity import AGREEMENT_BEAM, DEFAULT_TOLERANCE, MIN_AGREEMENT, SAMPLES, STEPS, Tolerance


@dataclass(frozen=True)
class VerifyRequest:
    """What to compare. None means "not given": the fp32-only and quantized-only options are refused on the
    other kind of directory only when given."""

    model_dir: Path
    input_file: Path | None = None
    beam_size: int = AGREEMENT_BEAM
    min_agreement: float | None = None  # default: MIN_AGREEMENT of the directory's precision
    checkpoint: Path | None = None  # fp32: the checkpoint (default: the one the manifest names)
    vocab: tuple[Path, ...] = ()
    samples: int | None = None  # fp32: random sources decoded by both sides
    steps: int | None = None  # fp32: decoder steps compared with the cache fed back
    atol: float | None = None
    rtol: float | None = None
    reference: Path | None = None  # fp16/int8: the fp32 directory (default: the manifest's parent)
    references_file: Path | None = None  # fp16/int8: true translations of the input
    report_dir: Path | None = None  # fp16/int8: markdown + histograms


@dataclass
class VerifyOutcome:
    lines: list[str]  # the table, for the terminal
    failures: list[str] = field(default_factory=list)
    summary: str = ""  # the last line when nothing failed
    kind: str = "parity"  # what failed: "parity" (fp32) or "precision"


def verify_model_dir(request: VerifyRequest, check_report_dir=lambda path: None) -> VerifyOutcome:
    """check_report_dir(path): the caller's check that --report can be written, run before any slow work."""
    precision = ModelDir.read(request.model_dir).precision
    if precision == "fp32":
        return _verify_fp32(request)
    return _verify_quantized(request, precision, check_report_dir)


def _verify_quantized(request: VerifyRequest, precision: str, check_report_dir) -> VerifyOutcome:
    from .precision import compare_precision, parent_directory, summary_lines, write_report
    given = [flag for flag, value in (("--samples", request.samples), ("--steps", request.steps),
                                      ("--atol", request.atol), ("--rtol", request.rtol)) if value is not None]
    if request.checkpoint or request.vocab or given:
        raise TfmExportError(f"{', '.join(given) or '--checkpoint/--vocab'}: for fp32 directories only; a "
                             "quantized directory is compared with its fp32 parent (--reference)")
    if request.input_file is None:
        raise TfmExportError(f"--input FILE is required for {precision} directories (sentences to compare on)")
    check_report_dir(request.report_dir)
    texts = read_text_lines(request.input_file)
    refs = read_text_lines(request.references_file) if request.references_file else None
    report = compare_precision(request.model_dir, parent_directory(request.model_dir, request.reference), texts,
                               refs, request.beam_size, request.min_agreement)
    lines = summary_lines(report)
    if request.report_dir:
        lines.append("wrote " + ", ".join(str(p) for p in write_report(report, request.report_dir)))
    return VerifyOutcome(lines, report.failures, f"{report.precision} OK against fp32 (agreement >= "
                                                 f"{report.min_agreement:.1%})", "precision")


def _verify_fp32(request: VerifyRequest) -> VerifyOutcome:
    from .fp32 import checkpoint_for, graph_backends, verify
    for flag, value in (("--reference", request.reference), ("--references", request.references_file),
                        ("--report", request.report_dir)):
        if value:
            raise TfmExportError(f"{flag} is for fp16/int8 directories; fp32 ones are compared with PyTorch")
    backends = graph_backends(request.model_dir)  # a damaged directory is its own error, checkpoint or not
    ckpt = checkpoint_for(request.model_dir, request.checkpoint, request.vocab)
    texts = read_text_lines(request.input_file) if request.input_file else []
    threshold = MIN_AGREEMENT["fp32"] if request.min_agreement is None else request.min_agreement
    tolerance = Tolerance(DEFAULT_TOLERANCE.atol if request.atol is None else request.atol,
                          DEFAULT_TOLERANCE.rtol if request.rtol is None else request.rtol)
    report = verify(backends, ckpt, texts, samples=request.samples or SAMPLES,
                    steps=request.steps or STEPS, beam_size=request.beam_size, tolerance=tolerance,
                    min_agreement=threshold)
    width = max(len(row.name) for row in [*report.tensors, *report.agreements])
    lines = [f"{'tensor':{width}} {'max abs':>10} {'max rel':>10}  ok"]
    lines += [f"{d.name:{width}} {d.max_abs:10.2e} {d.max_rel:10.2e}  {'yes' if d.within(tolerance) else 'NO'}"
              for d in report.tensors]
    lines += [f"{a.name:{width}} {a.identical:>5}/{a.total:<5} identical ({100 * a.rate:.1f}%)"
              + (f", {a.ties} near-tie{'s' if a.ties > 1 else ''}" if a.ties else "") for a in report.agreements]
    if any(a.ties for a in report.agreements):
        lines.append("near-tie: parts from the reference at a step whose two tokens the reference itself scores "
                     "within the tolerance (beam: an output it scores as high); not a divergence")
    return VerifyOutcome(lines, report.failures, f"parity OK (atol {tolerance.atol}, rtol {tolerance.rtol}, "
                                                 f"agreement >= {threshold:.0%})")
