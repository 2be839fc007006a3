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
from .common import read_text_lines, writable_output


def _ints(text: str, name: str, maximum: int | None = None) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of whole numbers", param_hint=name) from None
    if not values or min(values) < 1 or (maximum is not None and max(values) > maximum):
        raise click.BadParameter(f"values must be 1..{maximum or 'any'}", param_hint=name)
    return values


def _backends(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in BACKENDS]
    if not names:
        raise click.BadParameter("give at least one backend", param_hint="--backends")
    if unknown:
        raise click.BadParameter(f"unknown backend {unknown[0]!r}; choose from {', '.join(BACKENDS)}",
                                 param_hint="--backends")
    return names


def _input_rows(texts: list[str], model_path: Path, positions: int) -> list[list[int]]:
    """--input lines as ids with <s>/</s>, checked against the model's positions before any slow work."""
    rows, numbers = [], []
    tok = _source_tokenizer(model_path)
    for number, text in enumerate(texts, 1):
        if text.strip():
            rows.append([BOS_ID, *tok.encode(text), EOS_ID])
            numbers.append(number)
    if not rows:
        raise InputTextError("--input has no non-empty lines")
    too_long = next((n for n, row in zip(numbers, rows, strict=True) if len(row) > positions), None)
    if too_long is not None:
        raise InputTextError(f"--input: line {too_long} is longer than the model's {positions} positions; shorten it")
    return rows


def _sources(rows: list[list[int]] | None, vocab_size: int, count: int, positions: int,
             seed: int = 0) -> list[list[int]]:
    """The given rows cycled to `count`, else random tokens (12 to 24 per sentence, fewer for models with
    fewer positions)."""
    if rows is not None:
        return (rows * (count // len(rows) + 1))[:count]
    rng = random.Random(seed)
    longest = min(24, positions - 2)
    return [[BOS_ID, *(rng.randrange(4, vocab_size) for _ in range(rng.randint(longest // 2, longest))), EOS_ID]
            for _ in range(count)]


@click.command("bench")
@click.option("--model", "model_path", required=True, type=click.Path(exists=True, path_type=Path),
              help="A checkpoint (exported, quantized and converted here, timed) or an fp32 model directory.")
@click.option("--backends", default=",".join(BACKENDS), show_default=True,
              help="Comma-separated: " + "; ".join(f"{name}: {what}" for name, what in BACKENDS.items()) + ".")
@click.option("--batch-sizes", default="1,8,32", show_default=True,
              help="Comma-separated sentences per batch call; each is timed for every beam size.")
@click.option("--beam-sizes", default="1,4", show_default=True, help="Comma-separated; 1 = greedy (at most 64).")
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

    Each backend runs in its own process after a warm-up. PyTorch and CTranslate2 fp32 (the external
    anchor) are timed only if their greedy output matches ONNX Runtime fp32's; the agreement column shows
    every backend's. Results: a table here, and --json, --plot, --markdown files.
    """
    # Imported here: the spawned measuring processes re-import this module, and must not load PyTorch for
    # backends that do not use it (their peak RSS would include it).
    from ..bench_artifacts import build_fp32, build_variants, calibration_for
    settings = BenchSettings(_backends(backends), _ints(batch_sizes, "--batch-sizes"),
                             _ints(beam_sizes, "--beam-sizes", maximum=64), output_length, repeats, min_time, threads,
                             full_recompute_max_rows=full_recompute_max_rows)
    for path, option in ((json_path, "--json"), (plot_path, "--plot"), (markdown_path, "--markdown")):
        writable_output(path, option)
    _check_work_dir(work_dir)
    positions = _positions(model_path)
    length = output_length or positions
    if length > positions:
        raise InputTextError(f"--output-length {length} is beyond the model's {positions} positions")
    texts = read_text_lines(input_file) if input_file else None
    rows = _input_rows(texts, model_path, positions) if texts is not None else None
    calibration_texts = read_text_lines(calibration) if calibration else []
    say = lambda step: click.echo(f"[bench] {step}", err=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="tfm-bench-") as tmp:
        work = work_dir or Path(tmp)
        try:
            work.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TfmExportError(f"{work}: cannot create the work directory ({exc.strerror}); choose another "
                                 "--work-dir") from None
        built = build_fp32(model_path, work, say)
        vocab = built.artifacts.source_tokens
        sources = _sources(rows, len(vocab), sentences, positions)
        inputs = texts or [" ".join(vocab[i] for i in row[1:-1]) for row in sources]
        calib = calibration_for(inputs, calibration, calibration_texts, work / "calibration.txt", output_length or None)
        build_variants(built, work, calib, settings.backends, max(settings.batch_sizes) * max(settings.beam_sizes),
                       positions, say=say)
        results = run_backends(built.artifacts, sources, length, positions, settings,
                               progress=lambda n: say(f"measure {n}"))
    for line in [*table(results), "", *summary(results, built.size_mb, built.build_s), ""]:
        click.echo(line)
    found = ratios(results)
    for name, value in found.items():
        if value is not None:  # configurations this run did not measure are left out (the JSON keeps them)
            click.echo(f"ratio {name}: {value:.2f}x")
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
    if all(r.skipped for r in results):
        raise TfmExportError("no backend could run here; the table above says why for each")


def _positions(model_path: Path) -> int:
    """The model's positions, read before anything is exported."""
    from ..model_dir import read_manifest
    if model_path.is_dir():
        from ..config import ModelConfig
        return ModelConfig.from_dict(read_manifest(model_path)["model"]).n_position
    from ..checkpoint import load_checkpoint
    return load_checkpoint(model_path).config.n_position


def _source_tokenizer(model_path: Path):
    from ..model_dir import read_manifest, tokenizer_file
    from ..tokenizer import load_tokenizer
    if model_path.is_dir():
        return load_tokenizer(tokenizer_file(model_path, read_manifest(model_path)["tokenizer"]["source"]))
    from ..checkpoint import load_checkpoint
    return load_checkpoint(model_path).vocab.source


def _check_work_dir(work_dir: Path | None) -> None:
    if work_dir is None:
        return
    if work_dir.exists() and not work_dir.is_dir():
        raise TfmExportError(f"{work_dir}: is a file; choose another --work-dir")
    if (work_dir / "manifest.json").exists():
        raise TfmExportError(f"{work_dir}: is a model directory, which the benchmark would write into; choose another "
                             "--work-dir")
