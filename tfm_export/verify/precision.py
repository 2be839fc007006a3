"""`tfm-export verify` for fp16/int8 directories: how far they are from their fp32 parent.

Two views. Per graph, the output error when both graphs get exactly the same inputs (the fp32
model's own greedy decode over the texts, every step), so each graph's own loss is seen without the
drift of the other. End to end, what users see: decodes compared sentence by sentence and token by
token, BLEU with the fp32 outputs as reference, and exact match and BLEU against true references.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sacrebleu

from ..artifacts.model_dir import ModelDir
from ..core.errors import TfmExportError
from ..core.files import write_atomically, write_text_atomically
from ..core.graph_spec import LOGITS, Graph
from ..core.sources import encode_lines
from ..graphs.parity import AGREEMENT_BEAM, MIN_AGREEMENT, Agreement, token_agreement
from ..precision.calibration import record_traces
from ..runtime.backends import open_backend
from ..runtime.backends.loaders import open_contract_sessions
from ..runtime.session import DEFAULT_OPTIONS, run
from ..runtime.translator import DecodeOptions, Translator

HISTOGRAM_SAMPLES = 200_000
SHOW_DIFFERING = 5  # sentences shown per decode whose output differs from fp32 (as eval-demo shows its misses)


@dataclass(frozen=True)
class ErrorStats:
    """|quantized - fp32| over every element of a graph's compared outputs."""

    name: str
    count: int
    max_abs: float
    mean_abs: float
    p99_abs: float
    scale: float  # max |fp32|
    sample: np.ndarray = field(repr=False, compare=False)  # abs errors for the histogram

    @classmethod
    def of(cls, name: str, got: list[np.ndarray], want: list[np.ndarray], seed: int = 0) -> ErrorStats:
        err = np.concatenate([np.abs(g.astype(np.float64) - w).ravel() for g, w in zip(got, want, strict=True)])
        scale = max(float(np.abs(w).max()) for w in want)
        sample = np.random.default_rng(seed).choice(err, min(len(err), HISTOGRAM_SAMPLES), replace=False)
        return cls(name, err.size, float(err.max()), float(err.mean()), float(np.percentile(err, 99)), scale, sample)


@dataclass
class DecodeComparison:
    name: str  # "greedy" or "beam N"
    agreement: Agreement  # sentences token-identical to fp32
    token_rate: float  # tokens equal at the same position / tokens in the longer of the two outputs
    bleu_vs_fp32: float
    exact_match: tuple[float, float] | None = None  # (fp32, quantized) against references
    bleu: tuple[float, float] | None = None
    differing: list[tuple[str, str, str]] = field(default_factory=list)  # (source, fp32, quantized) where they differ


@dataclass
class PrecisionReport:
    model: Path
    parent: Path
    precision: str
    lines: int
    errors: list[ErrorStats]
    decodes: list[DecodeComparison]
    min_agreement: float

    @property
    def failures(self) -> list[str]:
        return [f"{d.name}: {d.agreement.identical}/{d.agreement.total} sentences identical to fp32 "
                f"(< {self.min_agreement:.1%})" for d in self.decodes if d.agreement.rate < self.min_agreement]


def parent_directory(directory: Path, given: Path | None) -> Path:
    """The fp32 directory this one was made from: the one given, else the manifest's; graphs checked."""
    recorded = ModelDir.read(directory).manifest.parent
    if not isinstance(recorded, dict) or not isinstance(recorded.get("path"), str) \
            or not isinstance(recorded.get("graphs_sha256"), dict):
        raise TfmExportError(f"{directory}/manifest.json: names no fp32 parent (parent.path, parent.graphs_sha256); "
                             "make the directory again with tfm-export quantize")
    parent = given or Path(recorded["path"])
    if not parent.is_dir():
        raise TfmExportError(f"{directory}: its fp32 parent {parent} is not here; pass --reference DIR")
    parent_dir = ModelDir.read(parent)
    parent_graphs = {g: parent_dir.entry(g).sha256 for g in parent_dir.graphs}
    if parent_graphs != recorded["graphs_sha256"]:
        raise TfmExportError(f"{parent}: is not the fp32 directory {directory} was made from (graph sha256 "
                             "differs); pass the right --reference")
    return parent


def graph_errors(directory: Path, parent: Path, texts: Sequence[str], tokenizer) -> list[ErrorStats]:
    """Each contract graph of `directory` fed exactly what the parent's fp32 graphs saw while greedy-decoding
    `texts`."""
    traces = record_traces(parent, texts, tokenizer, "--input", consequence="the comparison says little")
    # each pair's shared table (the second value) is memory its sessions read: held here as long as they are
    (model, _model_table), (fp32, _fp32_table) = (open_contract_sessions(ModelDir.read(d), DEFAULT_OPTIONS)
                                                  for d in (directory, parent))
    stats = []
    for graph, compared in ((Graph.ENCODER, None), (Graph.DECODER_STEP, (LOGITS,))):
        ours, theirs = model[graph], fp32[graph]
        dtypes = {i.name: i.type for i in ours.get_inputs()}
        got, want = [], []
        for feeds in traces.feeds[graph]:
            cast = {k: v.astype(np.float16) if dtypes[k] == "tensor(float16)" else v for k, v in feeds.items()}
            names = compared or [o.name for o in theirs.get_outputs()]
            a, b = run(ours, cast), run(theirs, feeds)
            got += [a[n] for n in names]
            want += [b[n] for n in names]
        label = "decoder_step logits" if compared else "encoder outputs"
        stats.append(ErrorStats.of(label, got, want))
    return stats


def _token_rate(got: list[tuple[int, ...]], want: list[tuple[int, ...]]) -> float:
    same = sum(sum(a == b for a, b in zip(g, w, strict=False)) for g, w in zip(got, want, strict=True))
    return same / max(1, sum(max(len(g), len(w)) for g, w in zip(got, want, strict=True)))


def compare_decodes(model: Translator, parent: Translator, texts: Sequence[str], beam_size: int,
                    references: Sequence[str] | None) -> list[DecodeComparison]:
    out = []
    for beam in sorted({1, beam_size}):
        options = DecodeOptions(beam_size=beam, batch_size=64)
        ours, theirs = model.translate(texts, options), parent.translate(texts, options)
        got, want = [t.ids for t in ours], [t.ids for t in theirs]
        name = "greedy" if beam == 1 else f"beam {beam}"
        agreement = token_agreement(name, got, want)
        comparison = DecodeComparison(
            name, agreement, _token_rate(got, want),
            sacrebleu.corpus_bleu([t.text for t in ours], [[t.text for t in theirs]]).score,
            differing=[(texts[i], theirs[i].text, ours[i].text) for i in agreement.differing])
        if references is not None:
            comparison.exact_match = tuple(np.mean([t.text == r for t, r in zip(side, references, strict=True)])
                                           for side in (theirs, ours))
            comparison.bleu = tuple(sacrebleu.corpus_bleu([t.text for t in side], [list(references)]).score
                                    for side in (theirs, ours))
        out.append(comparison)
    return out


def compare_precision(directory: Path, parent: Path, texts: Sequence[str], references: Sequence[str] | None = None,
                      beam_size: int = AGREEMENT_BEAM, min_agreement: float | None = None) -> PrecisionReport:
    if references is not None and len(references) != len(texts):
        raise TfmExportError(f"--references has {len(references)} lines but --input has {len(texts)}; "
                             "they must match line by line")
    opened = open_backend(directory)
    model, reference = Translator.of(opened), Translator.load(parent)
    rows = list(encode_lines(reference.vocab.source, texts, reference.config.n_position, "--input "))
    if not rows:
        raise TfmExportError("--input: has no non-empty lines to compare on; give sentences in the source language")
    texts = [texts[i] for i in rows]
    references = [references[i] for i in rows] if references is not None else None
    precision = opened.source.precision
    # tensor errors on the contract's graphs; the decodes below run what `tfm-run translate` runs (on the CPU,
    # decoder_step_search where the directories have it)
    errors = graph_errors(directory, parent, texts, reference.vocab.source)
    decodes = compare_decodes(model, reference, texts, beam_size, references)
    threshold = MIN_AGREEMENT[precision] if min_agreement is None else min_agreement
    return PrecisionReport(directory, parent, precision, len(texts), errors, decodes, threshold)


def summary_lines(report: PrecisionReport) -> list[str]:
    """The report as text rows, shared by the terminal and the markdown file."""
    rows = ["| graph output | elements | max abs | mean abs | p99 abs | max abs fp32 |",
            "|---|---:|---:|---:|---:|---:|"]
    rows += [f"| {e.name} | {e.count:,} | {e.max_abs:.3g} | {e.mean_abs:.3g} | {e.p99_abs:.3g} | {e.scale:.3g} |"
             for e in report.errors]
    rows += ["", "| decode | identical to fp32 | token agreement | BLEU vs fp32 | exact match fp32 -> "
             f"{report.precision} | BLEU fp32 -> {report.precision} |", "|---|---:|---:|---:|---:|---:|"]
    for d in report.decodes:
        exact = f"{100 * d.exact_match[0]:.1f}% -> {100 * d.exact_match[1]:.1f}%" if d.exact_match else "-"
        bleu = f"{d.bleu[0]:.2f} -> {d.bleu[1]:.2f}" if d.bleu else "-"
        rows.append(f"| {d.name} | {d.agreement.identical}/{d.agreement.total} ({100 * d.agreement.rate:.1f}%) | "
                    f"{100 * d.token_rate:.2f}% | {d.bleu_vs_fp32:.2f} | {exact} | {bleu} |")
    for d in report.decodes:
        if d.differing:
            rows += ["", f"{d.name}: differs from fp32 on {len(d.differing)} sentence(s):"]
            rows += [f"  {source!r} -> {ours!r} (fp32 {theirs!r})" for source, theirs, ours in
                     d.differing[:SHOW_DIFFERING]]
            rows += [f"  ... and {len(d.differing) - SHOW_DIFFERING} more"] if len(d.differing) > SHOW_DIFFERING else []
    return rows


def write_report(report: PrecisionReport, directory: Path) -> list[Path]:
    """precision-report.md and one error histogram PNG per graph, in `directory` (each file written whole)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TfmExportError(f"{directory}: cannot write the report ({exc.strerror}); choose a writable "
                             "--report directory") from None
    written = []
    for stats in report.errors:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        values = np.log10(np.maximum(stats.sample, 1e-12))
        ax.hist(values, bins=80, color="#3a6ea5")
        ax.set_xlabel("log10 |" + report.precision + " - fp32|")
        ax.set_ylabel("elements (sampled)")
        ax.set_title(f"{report.model.name}: {stats.name}, max {stats.max_abs:.2g}, p99 {stats.p99_abs:.2g}")
        fig.tight_layout()
        path = directory / f"errors-{stats.name.split()[0]}.png"
        write_atomically({path: lambda tmp, fig=fig: fig.savefig(tmp, dpi=100, format="png")}, "the report")
        plt.close(fig)
        written.append(path)
    md = directory / "precision-report.md"
    write_text_atomically(md, "\n".join([
        f"# {report.model}: {report.precision} against fp32 ({report.parent})", "",
        f"{report.lines} input lines; per-graph errors with identical inputs (the fp32 greedy decode's own, every "
        "step).", "", *summary_lines(report), "", *[f"![{p.stem}]({p.name})" for p in written], ""]), "the report")
    return [md, *written]
