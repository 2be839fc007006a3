"""One ONNX graph -> one serialized engine, through the builder API that TensorRT 10/11 and TensorRT-RTX share.

The graph is parsed into a network (strongly typed: precision comes from the graph, the only mode TensorRT 11
and TensorRT-RTX have; TensorRT 10 may take builder flags instead), given one optimisation profile, and
built. Everything the library logs is kept, so a refusal is one line naming the node the parser refused or
the builder's first error, and `tfm-export check` can say what each build said. Polygraphy's loaders make
the same calls but bind to TensorRT or TensorRT-RTX once per process (a switch read when Polygraphy is
first imported); calling the API directly lets each command name its library.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ..artifacts.engine_dir import TARGET_NAMES
from ..core.errors import TfmExportError, first_line
from ..runtime.tensorrt_platform import import_tensorrt

log = logging.getLogger(__name__)
Shapes = dict[str, tuple[tuple[int, ...], ...]]  # input name -> (min, opt, max) shapes


@dataclass(frozen=True)
class BuildSettings:
    strongly_typed: bool = True
    flags: tuple[str, ...] = ()  # "fp16", "int8": TensorRT 10 builder precision flags (weak typing only)
    workspace_mib: int | None = None
    timing_cache: Path | None = None  # read when present, then rewritten; TensorRT only (TensorRT-RTX would need
    # a GPU for it, and its engines do not depend on timings)


@dataclass(frozen=True)
class BuiltEngine:
    plan: bytes
    seconds: float
    warnings: tuple[str, ...]  # distinct, in the order logged


class BuildError(TfmExportError):
    """The parser or the builder refused a graph."""


def _recorder(trt):
    """An ILogger that keeps errors and warnings and passes everything to Python's logging (-v shows it)."""
    severity = trt.ILogger.Severity

    class Recorder(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []
            self.warnings: list[str] = []

        def log(self, level, message: str) -> None:
            if level in (severity.INTERNAL_ERROR, severity.ERROR):
                self.errors.append(message)
            elif level == severity.WARNING:
                self.warnings.append(message)
            log.log(logging.INFO if level in (severity.WARNING, severity.ERROR) else logging.DEBUG, "%s", message)

    return Recorder()


def build_engine(target: str, onnx_path: Path, shapes: Shapes,
                 settings: BuildSettings = BuildSettings()) -> BuiltEngine:
    """Parse and build one graph with the `target` library; a refusal is a BuildError of one line."""
    trt, name = import_tensorrt(target), TARGET_NAMES[target]
    try:
        return _build(trt, name, onnx_path, shapes, settings)
    except (RuntimeError, TypeError, ValueError) as exc:  # the bindings raise where the C++ API returns null
        raise BuildError(f"{onnx_path}: {name} failed ({first_line(exc)}); `tfm-export -v ...` shows its log") \
            from None


def _build(trt, name: str, onnx_path: Path, shapes: Shapes, settings: BuildSettings) -> BuiltEngine:
    start = time.perf_counter()
    logger = _recorder(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
                                     if settings.strongly_typed else 0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)] or logger.errors or ["no error given"]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise BuildError(f"{onnx_path}: {name}'s ONNX parser refused it: {first_line(errors[0])}{more}")
    config = _config(trt, builder, shapes, settings)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        said = first_line(logger.errors[0]) if logger.errors else "no error logged"
        raise BuildError(f"{onnx_path}: {name} could not build an engine ({said}); `tfm-export -v ...` shows its log")
    if settings.timing_cache:
        settings.timing_cache.write_bytes(bytes(config.get_timing_cache().serialize()))
    return BuiltEngine(bytes(plan), time.perf_counter() - start, tuple(dict.fromkeys(logger.warnings)))


def _config(trt, builder, shapes: Shapes, settings: BuildSettings):
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for tensor, (low, opt, high) in shapes.items():
        profile.set_shape(tensor, low, opt, high)
    config.add_optimization_profile(profile)
    config.clear_flag(trt.BuilderFlag.TF32)  # fp32 graphs build fp32 kernels, as ONNX Runtime runs them
    for flag in settings.flags:
        config.set_flag(getattr(trt.BuilderFlag, flag.upper()))
    if settings.workspace_mib:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_mib << 20)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # layer information for the engine inspector
    if settings.timing_cache:
        data = settings.timing_cache.read_bytes() if settings.timing_cache.is_file() else b""
        config.set_timing_cache(config.create_timing_cache(data), False)
    return config

