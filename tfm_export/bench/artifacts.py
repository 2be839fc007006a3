"""What a benchmark run loads, made once from one checkpoint (or an exported directory), with the time
each step took and the size each artifact has on disk."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..artifacts.model_dir import ModelDir
from ..core.errors import TfmExportError
from ..core.files import write_text_atomically
from ..core.token_rules import SEED_RULES, TokenRules
from ..core.tokenizer import Vocabulary
from ..graphs.generate_dir import write_generate_dir
from ..graphs.pipeline import export_model_dir
from ..model.checkpoint import Checkpoint, is_hf_directory
from ..model.loading import load_checkpoint
from ..precision.pipeline import Calibration, quantize_model_dir
from ..runtime.session import has_cuda_provider
from ..runtime.tensorrt_platform import missing_reason
from .ctranslate2 import convert_to_ctranslate2, unsupported
from .runners import NO_CHECKPOINT, Artifacts


@dataclass
class Built:
    artifacts: Artifacts
    build_s: dict[str, float] = field(default_factory=dict)  # artifact -> seconds to make it
    size_mb: dict[str, float] = field(default_factory=dict)  # artifact -> MB on disk


def _size_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.iterdir() if p.is_file() and p.suffix in
                                           (".onnx", ".data", ".bin", ".pt", ".plan")]
    return sum(p.stat().st_size for p in files) / 1e6


def _timed(built: Built, name: str, make: Callable[[], Path]) -> Path:
    start = time.perf_counter()
    path = make()
    built.build_s[name] = time.perf_counter() - start
    built.size_mb[name] = _size_mb(path)
    return path


@dataclass(frozen=True)
class BenchModel:
    """What --model names, read once: a checkpoint (loaded; with an fp32 export of it to time as is, where one
    is given) or an fp32 model directory (no checkpoint: the backends that need one are left out, saying why)."""

    path: Path
    checkpoint: Checkpoint | None
    fp32_dir: Path | None  # given: timed as is; None: exported from the checkpoint
    positions: int
    vocab: Vocabulary
    rules: TokenRules = SEED_RULES  # a pretrained model's ids and beam rule


def open_model(path: Path, fp32_dir: Path | None = None) -> BenchModel:
    """fp32_dir: the checkpoint's own fp32 export (its manifest names the checkpoint's sha256), timed as is
    instead of exported again: a large model's export, made once for its other benchmarks."""
    if not path.is_dir() or is_hf_directory(path):
        ckpt = load_checkpoint(path)
        if fp32_dir is not None:
            export = _fp32(fp32_dir, "bench --fp32-dir takes an fp32 export of the checkpoint")
            if export.manifest.source_checkpoint.sha256 != ckpt.sha256:
                raise TfmExportError(f"{fp32_dir}: was not exported from {path} (its manifest names another "
                                     "checkpoint's sha256); give that checkpoint's export, or leave it out")
        return BenchModel(path, ckpt, fp32_dir, ckpt.config.n_position, ckpt.vocab, ckpt.rules)
    if fp32_dir is not None:
        raise TfmExportError(f"{path}: is a model directory already; give the fp32 export alone, as the model")
    directory = _fp32(path, "bench --model takes a checkpoint or an fp32 model directory")
    return BenchModel(path, None, path, directory.config.n_position, directory.vocabulary(), directory.rules)


def _fp32(path: Path, wanted: str) -> ModelDir:
    directory = ModelDir.read(path)
    if directory.precision != "fp32":
        raise TfmExportError(f"{path}: is a {directory.precision} directory; {wanted} and makes the fp16/int8 "
                             "variants itself")
    return directory


def build_fp32(model: BenchModel, work: Path, say: Callable[[str], None] = lambda _: None) -> Built:
    """The fp32 directory (exported here, timed, unless `model` already is one) and the vocabularies."""
    fp32 = model.fp32_dir or work / "onnx-fp32"
    checkpoint = model.checkpoint.path if model.checkpoint else None
    built = Built(Artifacts(checkpoint, {"fp32": fp32}, None, *(tuple(t.tokens()) for t in
                                                               (model.vocab.source, model.vocab.target)),
                            rules=model.rules))
    if checkpoint:
        built.size_mb["checkpoint"] = _size_mb(checkpoint)
    if model.fp32_dir is None:
        say("export fp32")
        _timed(built, "onnx fp32", lambda: export_model_dir(model.checkpoint, fp32, force=True, progress=False)
               and fp32)
    built.size_mb.setdefault("onnx fp32", _size_mb(fp32))
    return built


def build_variants(built: Built, model: BenchModel, work: Path, calibration: Calibration, backends: Sequence[str],
                   max_rows: int, say: Callable[[str], None] = lambda _: None) -> None:
    """What the requested backends need, each timed: int8 static/dynamic directories, fp16 (with a CUDA
    provider), TensorRT fp16 engines for `max_rows` rows (with TensorRT and a GPU), the CTranslate2 model."""
    fp32, onnx = built.artifacts.onnx["fp32"], dict(built.artifacts.onnx)
    variants = {"int8-static": dict(precision="int8", calibration=calibration),
                "int8-dynamic": dict(precision="int8", mode="dynamic"),
                "fp16": dict(precision="fp16")}
    for variant, kwargs in variants.items():
        if f"ort-{variant}" not in backends or (variant == "fp16" and not has_cuda_provider()):
            continue
        say(f"quantize {variant}")
        onnx[variant] = _timed(built, f"onnx {variant}", lambda v=variant, k=kwargs: quantize_model_dir(
            fp32, work / f"onnx-{v}", force=True, progress=False, **k) and work / f"onnx-{v}")
    if "ort-generate" in backends and model.rules == SEED_RULES:  # generate.onnx is for the seed's token layout
        say("write generate.onnx")
        onnx["generate"] = _timed(built, "onnx generate", lambda: write_generate_dir(
            fp32, work / "onnx-generate", force=True, progress=False) and work / "onnx-generate")
    engines = None
    if "tensorrt" in backends and missing_reason() is None:
        engines = _tensorrt_engines(built, fp32, work / "tensorrt-fp16", max_rows, say)
    built.artifacts = replace(built.artifacts, onnx=onnx, tensorrt=engines)
    if any(b.startswith("ct2") for b in backends):
        _ctranslate2(built, model, work, say)


def _ctranslate2(built: Built, model: BenchModel, work: Path, say: Callable[[str], None]) -> None:
    """The CTranslate2 model, converted from the checkpoint's own weights (a Hugging Face directory's too)."""
    ckpt = model.checkpoint
    why = unsupported(ckpt.config) if ckpt else NO_CHECKPOINT
    if why or not importlib.util.find_spec("ctranslate2"):
        built.artifacts = replace(built.artifacts, ctranslate2_unsupported=why or None)
        return
    say("convert CTranslate2")
    ct2 = _timed(built, "ctranslate2", lambda: convert_to_ctranslate2(ckpt, work / "ctranslate2"))
    built.artifacts = replace(built.artifacts, ctranslate2=ct2)


def _tensorrt_engines(built: Built, fp32: Path, output: Path, max_rows: int,
                      say: Callable[[str], None]) -> Path | None:
    from ..trt.build import build_engines
    from ..trt.profiles import ShapeLimits
    say("build TensorRT fp16 engines")
    limits = ShapeLimits(max_batch=max_rows)
    try:
        return _timed(built, "tensorrt fp16", lambda: build_engines(fp32, output, "fp16", limits, force=True,
                                                                    progress=False) and output)
    except TfmExportError as exc:  # the other backends are still worth timing
        say(f"TensorRT engines not built: {exc}")
        return None


def calibration_for(texts: Sequence[str], given: Path | None, given_texts: Sequence[str], fallback: Path,
                    max_length: int | None) -> Calibration:
    """The calibration texts given, else the benchmark inputs (written to `fallback` for the manifest's sha256)."""
    if given is not None:
        return Calibration(given, list(given_texts), max_length)
    write_text_atomically(fallback, "\n".join(texts) + "\n", "the calibration texts")
    return Calibration(fallback, list(texts), max_length)
