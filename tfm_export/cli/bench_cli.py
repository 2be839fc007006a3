"""`tfm-run bench`: the benchmark command (registered on tfm-run's group)."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import click

from ..bench_report import markdown, plot, summary, table, to_json, write_text
from ..bench_runners import BACKENDS
from ..benchmark import BenchSettings, machine_info, ratios, run_backends
from ..errors import InputTextError, TfmExportError
from ..tokenizer import BOS_ID, EOS_ID
from ..trt_support import missing_reason
from .common import read_text_lines


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of whole numbers", param_hint=name) from None
    if not values or min(values) < 1:
        raise click.BadParameter("values must be >= 1", param_hint=name)
    return values


def _backends(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise click.BadParameter(f"unknown backend {unknown[0]!r}; choose from {', '.join(BACKENDS)}",
                                 param_hint="--backends")
    return names


def _sources(built, texts: list[str] | None, count: int, positions: int, seed: int = 0) -> list[list[int]]:
    """The inputs as ids with <s>/</s>: the given sentences, else random tokens (12 to 24 per sentence,
    fewer for models with fewer positions)."""
    vocab = built.artifacts.source_tokens
    if texts is not None:
        from ..model_dir import read_manifest
        from ..tokenizer import load_tokenizer
        fp32 = built.artifacts.onnx["fp32"]
        tok = load_tokenizer(fp32 / read_manifest(fp32)["tokenizer"]["source"])
        rows = [[BOS_ID, *tok.encode(t), EOS_ID] for t in texts if t.strip()]
        if not rows:
            raise InputTextError("--input has no non-empty lines")
        too_long = next((i for i, row in enumerate(rows) if len(row) > positions), None)
        if too_long is not None:
            raise InputTextError(f"--input: non-empty line {too_long + 1} is longer than the model's "
                                 f"{positions} positions; shorten it")
        return (rows * (count // len(rows) + 1))[:count]
    rng = random.Random(seed)
    longest = min(24, positions - 2)
    return [[BOS_ID, *(rng.randrange(4, len(vocab)) for _ in range(rng.randint(longest // 2, longest))), EOS_ID]
            for _ in range(count)]


@click.command("bench")
@click.option("--model", "model_path", required=True, type=click.Path(exists=True, path_type=Path),
              help="A checkpoint (exported, quantized and converted here, timed) or an fp32 model directory.")
@click.option("--backends", default=",".join(BACKENDS), show_default=True, help="Comma-separated backends.")
@click.option("--batch-sizes", default="1,8,32", show_default=True)
@click.option("--beam-sizes", default="1,4", show_default=True)
@click.option("--output-length", type=click.IntRange(min=0), default=64, show_default=True,
              help="Tokens every backend generates (</s> barred until then); 0 = stop at </s>.")
@click.option("--input", "input_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Sentences to decode (default: random token sequences of the source vocabulary).")
@click.option("--sentences", type=click.IntRange(min=1), default=32, show_default=True,
              help="How many inputs (the --input lines are cycled to fill).")
@click.option("--calibration", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Calibration texts for the int8 static graphs (default: the benchmark inputs).")
@click.option("--repeats", type=click.IntRange(min=2), default=5, show_default=True,
              help="Timed batches at most per backend, decode and batch size.")
@click.option("--min-time", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Seconds of timed batches to aim for before --repeats (at least two batches).")
@click.option("--threads", type=click.IntRange(min=0), default=0, show_default=True,
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
def bench(model_path: Path, backends: str, batch_sizes: str, beam_sizes: str, output_length: int,
          input_file: Path | None, sentences: int, calibration: Path | None, repeats: int, min_time: float,
          threads: int, full_recompute_max_rows: int, work_dir: Path | None, json_path: Path | None,
          plot_path: Path | None, markdown_path: Path | None) -> None:
    """Time every backend side by side on the same weights and inputs: latency, tokens/s, memory, size.

    Each backend runs in its own process after a warm-up; CTranslate2 (the external anchor) and every
    other backend must first produce ONNX Runtime fp32's greedy output (the agreement column).
    """
    # Imported here: the spawned measuring processes re-import this module, and must not load PyTorch for
    # backends that do not use it (their peak RSS would include it).
    from ..bench_artifacts import build_fp32, build_variants, calibration_for
    settings = BenchSettings(_backends(backends), _ints(batch_sizes, "--batch-sizes"),
                             _ints(beam_sizes, "--beam-sizes"), output_length, repeats, min_time, threads,
                             full_recompute_max_rows=full_recompute_max_rows)
    texts = read_text_lines(input_file) if input_file else None
    calibration_texts = read_text_lines(calibration) if calibration else []
    say = lambda step: click.echo(f"[bench] {step}", err=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="tfm-bench-") as tmp:
        work = work_dir or Path(tmp)
        try:
            work.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TfmExportError(f"{work}: cannot create the work directory ({exc.strerror})") from None
        built = build_fp32(model_path, work, say)
        positions = _positions(built)
        length = output_length or positions
        if length > positions:
            raise InputTextError(f"--output-length {length} is beyond the model's {positions} positions")
        sources = _sources(built, texts, sentences, positions)
        vocab = built.artifacts.source_tokens
        inputs = texts or [" ".join(vocab[i] for i in row[1:-1]) for row in sources]
        calib = calibration_for(inputs, calibration, calibration_texts, work / "calibration.txt", output_length or None)
        want_trt = "tensorrt" in settings.backends and missing_reason() is None
        build_variants(built, work, calib, want_fp16="ort-fp16" in settings.backends and _has_cuda(),
                       want_tensorrt=want_trt, max_rows=max(settings.batch_sizes) * max(settings.beam_sizes),
                       positions=positions, say=say)
        results = run_backends(built.artifacts, sources, length, positions, settings,
                               progress=lambda n: say(f"measure {n}"))
    for line in [*table(results), "", *summary(results, built.size_mb, built.build_s), ""]:
        click.echo(line)
    found = ratios(results)
    for name, value in found.items():
        click.echo(f"ratio {name}: " + ("-" if value is None else f"{value:.2f}x"))
    info = {"machine": machine_info(), "model": str(model_path), "input": str(input_file) if input_file else "random",
            "sentences": sentences, "output_length": length, "forced": output_length > 0,
            "sizes_mb": built.size_mb, "build_s": built.build_s,
            "ratios": found}
    if json_path:
        to_json(json_path, results, settings, info)
    if plot_path:
        plot(plot_path, results, f"{model_path} on {info['machine']['cpu']}")
    if markdown_path:
        text = markdown(results, built.size_mb, built.build_s, found, info)
        write_text(markdown_path, text)


def _positions(built) -> int:
    from ..config import ModelConfig
    from ..model_dir import read_manifest
    return ModelConfig.from_dict(read_manifest(built.artifacts.onnx["fp32"])["model"]).n_position


def _has_cuda() -> bool:
    import onnxruntime as ort
    return "CUDAExecutionProvider" in ort.get_available_providers()
