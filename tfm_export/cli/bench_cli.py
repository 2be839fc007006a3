"""`tfm-run bench`: the benchmark command (registered on tfm-run's group)."""

from __future__ import annotations

from pathlib import Path

import click

from ..bench.protocol import MAX_BATCH_SIZE, MAX_SENTENCES, BenchSettings
from ..bench.runners import CPU_BACKENDS, DEVICES, GPU_BACKENDS, TIMED_BACKENDS
from ..core.errors import TfmExportError
from ..core.extras import require_extra
from ..core.files import check_output_path
from ..core.machine import MAX_THREADS
from ..runtime.translator import MAX_BEAM
from .common import FiniteFloatRange


def _ints(text: str, name: str, maximum: int | None = None) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of whole numbers", param_hint=name) from None
    if not values or min(values) < 1 or (maximum is not None and max(values) > maximum):
        raise click.BadParameter(f"values must be 1..{maximum or 'any'}", param_hint=name)
    return values


def _cells(text: str | None) -> tuple[tuple[int, int], ...]:
    """BEAMxBATCH,... (4x32: beam 4, batch 32) -> ((4, 32), ...); None -> () (every beam with every batch)."""
    if text is None:
        return ()
    cells = []
    for cell in text.split(","):
        beam, _, batch = cell.strip().partition("x")
        if not (beam.isdigit() and batch.isdigit()):
            raise click.BadParameter(f"{cell!r} is not BEAMxBATCH (4x32: beam 4, batch 32)", param_hint="--cells")
        cells.append((_ints(beam, "--cells", MAX_BEAM)[0], _ints(batch, "--cells", MAX_BATCH_SIZE)[0]))
    return tuple(cells)


def _backends(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in TIMED_BACKENDS]
    if not names:
        raise click.BadParameter("give at least one backend", param_hint="--backends")
    if unknown:
        raise click.BadParameter(f"unknown backend {unknown[0]!r}; choose from {', '.join(TIMED_BACKENDS)}",
                                 param_hint="--backends")
    return names


@click.command("bench")
@click.option("--model", "model_path", required=True, type=click.Path(exists=True, path_type=Path),
              help="A checkpoint (exported, quantized and converted here, timed) or an fp32 model directory.")
@click.option("--device", type=click.Choice(DEVICES), default="cpu", show_default=True,
              help="Where every backend runs. cuda: an NVIDIA GPU (onnxruntime-gpu; PyTorch with CUDA for generate() "
                   "and the PyTorch backends), timing by default " + ", ".join(GPU_BACKENDS) + ".")
@click.option("--backends", default=None,
              help="Comma-separated: " + "; ".join(f"{name}: {what}" for name, what in TIMED_BACKENDS.items()) +
                   ". Default: all but the CUDA-graph ones on cpu (each one that cannot run here says why), the GPU "
                   "ones on cuda.")
@click.option("--batch-sizes", default="1,8,32", show_default=True,
              help=f"Comma-separated sentences per batch call (at most {MAX_BATCH_SIZE}); each is timed for every "
                   "beam size.")
@click.option("--beam-sizes", default="1,4", show_default=True,
              help=f"Comma-separated; 1 = greedy (at most {MAX_BEAM}).")
@click.option("--cells", default=None,
              help="Comma-separated BEAMxBATCH cells to time instead of every --beam-sizes with every "
                   "--batch-sizes (1x1,1x128,4x32: greedy batch 1 and 128, beam 4 batch 32).")
@click.option("--output-length", type=click.IntRange(min=0), default=64, show_default=True,
              help="Tokens every backend generates (</s> barred until then); 0 = stop at </s>.")
@click.option("--input", "input_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Sentences to decode (default: random token sequences of the source vocabulary).")
@click.option("--sentences", type=click.IntRange(1, MAX_SENTENCES), default=32, show_default=True,
              help="How many inputs (the --input lines are cycled to fill).")
@click.option("--calibration", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Calibration texts for the int8 static graphs (default: the benchmark inputs).")
@click.option("--repeats", type=click.IntRange(min=2), default=5, show_default=True,
              help="Timed batches at most per backend, decode and batch size.")
@click.option("--min-time", type=FiniteFloatRange(0, 3600), default=2.0, show_default=True,
              help="Seconds of timed batches to aim for before --repeats (at least two batches).")
@click.option("--threads", type=click.IntRange(0, MAX_THREADS), default=0, show_default=True,
              help="Threads per backend (0 = each library's default, all cores).")
@click.option("--full-recompute-max-rows", type=click.IntRange(min=1), default=8, show_default=True,
              help="Time torch-full (no cache) only where batch x beam is at most this; it is quadratic in length.")
@click.option("--work-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Keep the artifacts here (default: a temporary directory, removed afterwards).")
@click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Every timing, with machine info and library versions.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="PNG: tokens/s per backend and batch size, and latency against output length.")
@click.option("--markdown", "markdown_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="The tables as markdown (docs/benchmarks.md is made from these).")
def bench(model_path: Path, device: str, backends: str | None, batch_sizes: str, beam_sizes: str, cells: str | None,
          output_length: int, input_file: Path | None, sentences: int, calibration: Path | None, repeats: int,
          min_time: float, threads: int, full_recompute_max_rows: int, work_dir: Path | None, json_path: Path | None,
          plot_path: Path | None, markdown_path: Path | None) -> None:
    """Time every backend side by side on the same weights and inputs: latency, tokens/s, memory, size.

    Each backend runs in its own process after a warm-up. PyTorch and CTranslate2 fp32 (the external
    anchor) are timed only if their greedy output matches ONNX Runtime fp32's; the agreement column shows
    every backend's. Results: a table here, and --json, --plot, --markdown files.
    """
    require_extra("export", "tfm-run bench")
    from ..bench.run import BenchRequest, run_benchmark
    default = GPU_BACKENDS if device == "cuda" else CPU_BACKENDS
    chosen = _backends(backends) if backends is not None else default
    settings = BenchSettings(chosen, _ints(batch_sizes, "--batch-sizes", maximum=MAX_BATCH_SIZE),
                             _ints(beam_sizes, "--beam-sizes", maximum=MAX_BEAM), output_length, repeats, min_time,
                             threads, cells=_cells(cells), full_recompute_max_rows=full_recompute_max_rows,
                             device=device)
    for path, option in ((json_path, "--json"), (plot_path, "--plot"), (markdown_path, "--markdown")):
        check_output_path(path, option, inputs=[p for p in (model_path, input_file, calibration) if p])
    request = BenchRequest(model_path, settings, input_file, sentences, calibration, work_dir)
    run = run_benchmark(request, say=lambda step: click.echo(f"[bench] {step}", err=True))
    for line in run.lines():
        click.echo(line)
    run.write(json_path, plot_path, markdown_path)
    if run.failure:
        raise TfmExportError(run.failure)
