"""What a benchmark run loads, made once from one checkpoint (or an exported directory), with the time
each step took and the size each artifact has on disk."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .bench_runners import Artifacts
from .checkpoint import load_checkpoint
from .ctranslate2_convert import convert_to_ctranslate2
from .errors import TfmExportError
from .export_pipeline import export_model_dir
from .model_dir import read_manifest
from .quantize_pipeline import Calibration, quantize_model_dir
from .trt_support import missing_reason


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


def build_fp32(model: Path, work: Path, say: Callable[[str], None] = lambda _: None) -> Built:
    """The fp32 directory (exported here, timed, unless `model` already is one) and the vocabularies."""
    if model.is_dir():
        fp32, source = model, Path(read_manifest(model)["source_checkpoint"].get("path", ""))
        checkpoint = source if source.is_file() else None
    else:
        fp32, checkpoint = work / "onnx-fp32", model
    built = Built(Artifacts(checkpoint, {"fp32": fp32}, None))
    if checkpoint:
        built.size_mb["checkpoint"] = _size_mb(checkpoint)
    if not model.is_dir():
        say("export fp32")
        ckpt = load_checkpoint(checkpoint)
        _timed(built, "onnx fp32", lambda: export_model_dir(ckpt, fp32, force=True, progress=False) and fp32)
    built.size_mb.setdefault("onnx fp32", _size_mb(fp32))
    built.artifacts = replace(built.artifacts, **dict(zip(("source_tokens", "target_tokens"), _token_lists(fp32),
                                                          strict=True)))
    return built


def build_variants(built: Built, work: Path, calibration: Calibration, backends: Sequence[str], max_rows: int,
                   positions: int, say: Callable[[str], None] = lambda _: None) -> None:
    """What the requested backends need, each timed: int8 static/dynamic directories, fp16 (with a CUDA
    provider), TensorRT fp16 engines for `max_rows` rows (with TensorRT and a GPU), the CTranslate2 model."""
    fp32, onnx = built.artifacts.onnx["fp32"], dict(built.artifacts.onnx)
    variants = {"int8-static": dict(precision="int8", calibration=calibration),
                "int8-dynamic": dict(precision="int8", mode="dynamic"),
                "fp16": dict(precision="fp16")}
    for variant, kwargs in variants.items():
        if f"ort-{variant}" not in backends or (variant == "fp16" and not _has_cuda()):
            continue
        say(f"quantize {variant}")
        onnx[variant] = _timed(built, f"onnx {variant}", lambda v=variant, k=kwargs: quantize_model_dir(
            fp32, work / f"onnx-{v}", force=True, progress=False, **k) and work / f"onnx-{v}")
    engines = None
    if "tensorrt" in backends and missing_reason() is None:
        engines = _tensorrt_engines(built, fp32, work / "tensorrt-fp16", max_rows, positions, say)
    ct2 = None
    if any(b.startswith("ct2") for b in backends) and built.artifacts.checkpoint and \
            importlib.util.find_spec("ctranslate2"):
        say("convert CTranslate2")
        ckpt = load_checkpoint(built.artifacts.checkpoint)
        ct2 = _timed(built, "ctranslate2", lambda: convert_to_ctranslate2(ckpt, work / "ctranslate2"))
    built.artifacts = replace(built.artifacts, onnx=onnx, ctranslate2=ct2, tensorrt=engines)


def _tensorrt_engines(built: Built, fp32: Path, output: Path, max_rows: int, positions: int,
                      say: Callable[[str], None]) -> Path | None:
    from .trt_build import build_engines
    from .trt_profiles import ShapeLimits
    say("build TensorRT fp16 engines")
    limits = ShapeLimits(max_batch=max_rows, max_source_length=positions, max_target_length=positions)
    try:
        return _timed(built, "tensorrt fp16", lambda: build_engines(fp32, output, "fp16", limits, force=True,
                                                                    progress=False) and output)
    except TfmExportError as exc:  # the other backends are still worth timing
        say(f"TensorRT engines not built: {exc}")
        return None


def _has_cuda() -> bool:
    import onnxruntime as ort
    return "CUDAExecutionProvider" in ort.get_available_providers()


def _token_lists(fp32: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    from .tokenizer import load_tokenizer
    files = read_manifest(fp32)["tokenizer"]
    sides = [load_tokenizer(fp32 / files[side]) for side in ("source", "target")]
    return tuple(tuple(t.tokenizer.id_to_token(i) for i in range(t.vocab_size)) for t in sides)


def calibration_for(texts: Sequence[str], given: Path | None, given_texts: Sequence[str], fallback: Path,
                    max_length: int | None) -> Calibration:
    """The calibration texts given, else the benchmark inputs (written to `fallback` for the manifest's sha256)."""
    if given is not None:
        return Calibration(given, list(given_texts), max_length)
    fallback.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return Calibration(fallback, list(texts), max_length)
