"""A whole `tfm-run bench` run: read the model once, make the artifacts, measure every backend in its own
process, and write the report files. The command line only parses options and prints."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifacts.manifest import MANIFEST
from ..core.errors import InputTextError, TfmExportError
from ..core.files import write_text_atomically
from ..core.sources import cut_source, encode_lines, read_text_lines
from ..core.token_rules import SEED_RULES
from ..core.tokenizer import BOS_ID, EOS_ID, FIRST_TOKEN_ID
from ..runtime.session import has_cuda_provider
from .artifacts import BenchModel, Built, build_fp32, build_variants, calibration_for, open_model
from .protocol import BackendResult, BenchSettings, machine_info, ratios, run_backends
from .report import markdown, plot, summary, table, to_json
from .runners import wrong_device


@dataclass(frozen=True)
class BenchRequest:
    model: Path  # a checkpoint, or an fp32 model directory
    settings: BenchSettings
    input_file: Path | None = None  # default: random token sequences of the source vocabulary
    sentences: int = 32  # inputs; the --input lines are cycled to fill
    calibration: Path | None = None  # int8 static calibration texts; default: the inputs
    work_dir: Path | None = None  # keep the artifacts here; default: a temporary directory


@dataclass
class BenchRun:
    results: list[BackendResult]
    built: Built
    ratios: dict[str, float | None]
    info: dict[str, Any]  # machine, inputs and sizes, as the JSON and markdown reports print them
    settings: BenchSettings

    def lines(self) -> list[str]:
        """The tables and the ratios this run measured (the JSON keeps the ones it did not)."""
        out = [*table(self.results), "", *summary(self.results, self.built.size_mb, self.built.build_s), ""]
        out += [f"ratio {name}: {value:.2f}x" for name, value in self.ratios.items() if value is not None]
        return out + [f"step floor, {cell}: {ms:.3f} ms" for cell, ms in self.info.get("step_floor_ms", {}).items()]

    def write(self, json_path: Path | None, plot_path: Path | None, markdown_path: Path | None) -> None:
        if json_path:
            to_json(json_path, self.results, self.settings, self.info)
        if plot_path:
            machine = self.info["machine"]
            plot(plot_path, self.results, f"{self.info['model']} on {machine.get('gpu') or machine['cpu']}")
        if markdown_path:
            write_text_atomically(markdown_path, markdown(self.results, self.built.size_mb, self.built.build_s,
                                                          self.ratios, self.info), "the markdown report")

    @property
    def failure(self) -> str | None:
        if all(r.skipped for r in self.results):
            return "no backend could run here; the table above says why for each"
        return None


def run_benchmark(request: BenchRequest, say: Callable[[str], None] = lambda _: None) -> BenchRun:
    """Everything is checked (work directory, output length, input lines) before the slow work starts."""
    settings = request.settings
    _check_work_dir(request.work_dir)
    _check_device(settings.device)
    _check_backends(settings)
    model = open_model(request.model)
    length = settings.output_length or model.positions
    if length > model.positions:
        raise InputTextError(f"--output-length {length} is beyond the model's {model.positions} positions")
    texts = read_text_lines(request.input_file) if request.input_file else None
    rows = _input_rows(texts, model) if texts is not None else None
    calibration_texts = read_text_lines(request.calibration) if request.calibration else []
    with tempfile.TemporaryDirectory(prefix="tfm-bench-") as tmp:
        work = request.work_dir or Path(tmp)
        try:
            work.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TfmExportError(f"{work}: cannot create the work directory ({exc.strerror}); choose another "
                                 "--work-dir") from None
        built = build_fp32(model, work, say)
        vocab = built.artifacts.source_tokens
        sources = bench_sources(rows, model, len(vocab), request.sentences)
        inputs = texts or bench_texts(model, len(vocab), request.sentences)
        calib = calibration_for(inputs, request.calibration, calibration_texts, work / "calibration.txt",
                                settings.output_length or None)
        build_variants(built, model, work, calib, settings.backends, settings.max_rows, say=say)
        placement = _gpu_placement(built.artifacts.onnx, settings, say) if settings.device == "cuda" else None
        results = run_backends(built.artifacts, sources, length, model.positions, settings,
                               progress=lambda n: say(f"measure {n}"))
        floors = _gpu_step_floors(model, settings, sources, length, say) if settings.device == "cuda" else {}
    found = ratios(results)
    info = {"machine": machine_info(settings.device), "model": str(request.model),
            "input": str(request.input_file) if request.input_file else "random", "sentences": request.sentences,
            "output_length": length, "forced": settings.output_length > 0, "sizes_mb": built.size_mb,
            "build_s": built.build_s, "ratios": found, **({"step_floor_ms": floors} if floors else {}),
            **({"placement": placement} if placement else {})}
    return BenchRun(results, built, found, info, settings)


def _gpu_placement(directories: dict[str, Path], settings: BenchSettings, say: Callable[[str], None]
                   ) -> str | None:
    """Where the fp32 and fp16 decoder steps' nodes run on the GPU (bench.placement), said first: a node on the
    CPU or a Memcpy would be paid in every cell below, and blocks a CUDA graph's capture."""
    if not has_cuda_provider():
        return None
    from ..runtime.session import SessionOptions
    from .placement import step_placement
    options = SessionOptions(intra_op_threads=settings.threads, device="cuda")
    lines = [f"{variant} {step_placement(directories[variant], options).line}"
             for variant in ("fp32", "fp16") if variant in directories]
    for line in lines:
        say(f"placement: {line}")
    return "; ".join(lines)


def _gpu_step_floors(model: BenchModel, settings: BenchSettings, sources: list[list[int]], length: int,
                     say: Callable[[str], None]) -> dict[str, float]:
    """decoder_step_search alone on the GPU (bench.step_floor), per (beam, batch) timed, at the mean cache length
    and source length: the step no loop around it can beat; beside it the same step's captured CUDA graph
    replayed, where it can be captured. Needs the model's weights (not an fp32 directory)."""
    if model.checkpoint is None or not has_cuda_provider():
        return {}
    from .step_floor import REPLAY, exported_step, replay_ms, step_floor_ms
    say("GPU step floor")
    source, weights = round(sum(map(len, sources)) / len(sources)), model.checkpoint.model
    floors = {}
    with exported_step(weights) as graph:
        for beam, batch in settings.grid:
            cell, shape = f"beam {beam}, batch {batch}", (weights, batch, beam, (length - 1) // 2, source)
            floors[cell] = step_floor_ms(graph, *shape, device="cuda")["CUDA"]
            try:
                floors[f"{cell}, {REPLAY}"] = replay_ms(graph, *shape)
            except TfmExportError as exc:
                say(f"{cell}: no {REPLAY}: {exc}")
    return floors


def _input_rows(texts: list[str], model: BenchModel) -> list[list[int]]:
    """--input lines as ids with <s>/</s>, checked against the model's positions before any slow work."""
    rows = list(encode_lines(model.vocab.source, texts, model.positions, "--input ").values())
    if not rows:
        raise InputTextError("--input has no non-empty lines")
    return rows


def bench_sources(rows: list[list[int]] | None, model: BenchModel, vocab_size: int, count: int,
             seed: int = 0) -> list[list[int]]:
    """The given rows cycled to `count`, else random tokens (12 to 24 per sentence, fewer for models with
    fewer positions). A pretrained model's tokenizer frames sources its own way: it encodes random text."""
    if rows is not None:
        return (rows * (count // len(rows) + 1))[:count]
    if model.rules != SEED_RULES:
        tok = model.vocab.source
        return [cut_source(tok.encode(text, framed=True), model.positions)
                for text in bench_texts(model, vocab_size, count, seed)]
    return [[BOS_ID, *ids, EOS_ID] for ids in _random_ids(model, vocab_size, count, seed)]


def _random_ids(model: BenchModel, vocab_size: int, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    longest = min(24, model.positions - 2)
    return [[rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(rng.randint(longest // 2, longest))]
            for _ in range(count)]


def bench_texts(model: BenchModel, vocab_size: int, count: int, seed: int = 0) -> list[str]:
    """The random sources as text (calibration for int8 static, a first sentence to time): the seed's tokens
    joined, or a pretrained model's random target ids decoded (its target tokenizer names every piece)."""
    if model.rules == SEED_RULES:
        tokens = model.vocab.source.tokens()
        return [" ".join(tokens[i] for i in ids) for ids in _random_ids(model, vocab_size, count, seed)]
    size = model.vocab.target.vocab_size
    return [model.vocab.target.decode(ids) for ids in _random_ids(model, size, count, seed)]


def _check_device(device: str) -> None:
    if device != "cuda" or has_cuda_provider():
        return
    import torch
    if not torch.cuda.is_available():
        raise TfmExportError("--device cuda: no CUDA GPU here (onnxruntime has no CUDA provider, PyTorch sees no GPU); "
                             "run on a machine with one and onnxruntime-gpu, or drop --device")


def _check_backends(settings: BenchSettings) -> None:
    """Backends that all need the other device fail here, not after minutes of export."""
    reasons = {name: wrong_device(name, settings.device) for name in settings.backends}
    if reasons and all(reasons.values()):
        said = "; ".join(f"{name}: {reason}" for name, reason in reasons.items())
        raise TfmExportError(f"no backend could run here ({said}); choose --backends for --device {settings.device}")


def _check_work_dir(work_dir: Path | None) -> None:
    if work_dir is None:
        return
    if work_dir.exists() and not work_dir.is_dir():
        raise TfmExportError(f"{work_dir}: is a file; choose another --work-dir")
    if (work_dir / MANIFEST).exists():
        raise TfmExportError(f"{work_dir}: is a model directory, which the benchmark would write into; choose another "
                             "--work-dir")
