"""Model directory -> TensorRT engine directory: one plan per graph, one optimisation profile each.

Precision is decided in the graph (README, "Precision"): the fp16 and int8 (Q/DQ)
graphs of `tfm-export quantize` are built as strongly typed networks, the only way TensorRT 11 and
TensorRT-RTX take precision. TensorRT 10 (JetPack 6 ships 10.3) may instead build the fp32 graph with
builder flags (`weak_typing`); the engine is then inspected, and one with no layer in the requested
precision is refused rather than shipped as a silent fp32 engine. The target names the library:
TensorRT builds for the GPU here (which it needs); TensorRT-RTX builds on any machine, without a GPU,
for the GPUs it runs on (compute capability 8.0, 8.6, 8.9, 12.0+).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .. import __version__
from ..artifacts.engine_dir import RTX, TARGET_NAMES, TENSORRT, EngineDir, plan_name
from ..artifacts.manifest import ENGINE_FORMAT, ENGINE_FORMAT_VERSION, write_manifest
from ..artifacts.model_dir import (
    PRECISIONS,
    ModelDir,
    file_hashes,
)
from ..artifacts.records import EngineManifest
from ..artifacts.staging import check_output, staged_directory
from ..core.errors import TfmExportError
from ..core.files import file_sha256, write_atomically
from ..core.graph_spec import CONTRACT_GRAPHS, Graph, contract_specs
from ..precision.pipeline import quantize_model_dir
from ..runtime.tensorrt_platform import Platform, build_platform, import_tensorrt
from .builder import BuildSettings, Shapes, build_engine
from .profiles import ShapeLimits, profile_shapes

# What TensorRT's engine inspector calls the precisions (layer output formats).
INSPECTOR_NAMES = {"fp16": ("half", "fp16"), "int8": ("int8",)}


@dataclass(frozen=True)
class BuildPlan:
    """Which graphs to build and how: strongly typed from the typed graphs, or builder flags (TRT 10)."""

    precision: str
    strongly_typed: bool
    make_fp16: bool = False  # the fp16 graph is made from the fp32 directory first
    flags: tuple[str, ...] = ()  # fp16 / int8 builder flags, weak typing only

    @property
    def precision_source(self) -> str:
        return "graph (strongly typed)" if self.strongly_typed else f"builder flags ({', '.join(self.flags)})"


def plan_build(source_precision: str, int8_mode: str | None, precision: str, tensorrt_major: int,
               weak_typing: bool) -> BuildPlan:
    """Match the request to the directory and the TensorRT version; every mismatch is a one-line error."""
    if precision not in PRECISIONS:
        raise TfmExportError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if weak_typing and tensorrt_major >= 11:
        raise TfmExportError("--weak-typing: TensorRT 11 removed builder precision flags; precision comes from the "
                             "graph (drop --weak-typing)")
    if source_precision == "int8" and int8_mode != "static":
        raise TfmExportError("this int8 directory is dynamic (run-time activation quantization, ONNX Runtime CPU "
                             "only); TensorRT needs the Q/DQ graphs of `tfm-export quantize --precision int8 --mode "
                             "static`")
    if precision == source_precision:
        if weak_typing and precision != "fp32":
            flags = ("int8", "fp16") if precision == "int8" else ("fp16",)
            return BuildPlan(precision, strongly_typed=False, flags=flags)
        return BuildPlan(precision, strongly_typed=True)
    if precision == "fp16" and source_precision == "fp32":
        if weak_typing:
            return BuildPlan("fp16", strongly_typed=False, flags=("fp16",))
        return BuildPlan("fp16", strongly_typed=True, make_fp16=True)
    if precision == "int8":
        raise TfmExportError(f"--int8 needs an int8 static directory, this one is {source_precision}; make it with "
                             "`tfm-export quantize --precision int8 --calibration FILE` and build from that")
    raise TfmExportError(f"this directory is {source_precision}; building {precision} engines from it would change "
                         f"its precision behind your back: pass --{source_precision} or use an fp32 directory")


def check_target_options(target: str, weak_typing: bool, timing_cache: Path | None) -> None:
    """What a target's library cannot do, before anything is read."""
    if target not in TARGET_NAMES:
        raise TfmExportError(f"unknown target {target!r}; choose one of {', '.join(TARGET_NAMES)}")
    if target == RTX and weak_typing:
        raise TfmExportError("--weak-typing: TensorRT-RTX has no builder precision flags; precision comes from the "
                             "graph (drop --weak-typing)")
    if target == RTX and timing_cache:
        raise TfmExportError("--timing-cache: TensorRT-RTX builds take none (it would make the build need a GPU, "
                             "and its engines do not depend on it); drop --timing-cache")


def build_engines(model_dir: Path, output: Path, precision: str | None = None, limits: ShapeLimits | None = None,
                  timing_cache: Path | None = None, workspace_mib: int | None = None, weak_typing: bool = False,
                  force: bool = False, progress: bool = True, target: str = TENSORRT) -> EngineManifest:
    """Write the engine directory; returns its manifest."""
    check_target_options(target, weak_typing, timing_cache)
    directory = ModelDir.read(model_dir)
    config = directory.config
    limits = (limits or ShapeLimits()).resolved(config.n_position)
    precision = precision or directory.precision
    source_precision, mode = directory.precision, directory.int8_mode
    plan_build(source_precision, mode, precision, 10, weak_typing)  # the request's own mistakes first
    keep = (model_dir, *([timing_cache] if timing_cache else []))
    check_output(output, force, keep)
    directory.vocabulary()  # the directory is whole (every file as hashed) before TensorRT is sought
    directory.verified_graphs()  # engines are built from the contract's two; optional graphs are checked too
    platform = build_platform(target)
    plan = plan_build(source_precision, mode, precision, platform.tensorrt_major, weak_typing)
    specs = contract_specs(config)
    with staged_directory(output, force, keep=keep) as staging, tempfile.TemporaryDirectory() as tmp, \
            tqdm(total=len(specs) + 1, desc=f"{TARGET_NAMES[target]} {precision}", disable=not progress) as bar:
        source = model_dir
        if plan.make_fp16:
            bar.set_postfix_str("fp16 graphs")
            source = Path(tmp) / "fp16"
            quantize_model_dir(model_dir, source, "fp16", progress=False)
        graphs = ModelDir.read(source)  # the graphs the engines are built from
        cache = Path(tmp) / "timing.cache" if timing_cache else None
        if timing_cache and timing_cache.is_file():
            shutil.copyfile(timing_cache, cache)
        settings = BuildSettings(plan.strongly_typed, plan.flags, workspace_mib, cache)
        bar.update()
        engines = {}
        for graph in CONTRACT_GRAPHS:
            bar.set_postfix_str(graph.value)
            engines[graph.value] = _write_plan(graph, graphs, profile_shapes(specs[graph], limits),
                                               plan, settings, target, staging)
            bar.update()
        tokenizers = file_hashes(staging, directory.copy_tokenizers(staging))
        write_manifest(staging, _engine_manifest(directory, model_dir, graphs, plan, platform, limits,
                                                 engines, tokenizers))
        if timing_cache:
            write_atomically({timing_cache: lambda tmp: shutil.copyfile(cache, tmp)}, "the timing cache")
    return EngineDir.read(output).manifest


def _write_plan(graph: Graph, source: ModelDir, shapes: Shapes, plan: BuildPlan, settings: BuildSettings,
                target: str, staging: Path) -> dict[str, Any]:
    """Build one graph's plan into the staging directory; returns its manifest entry."""
    onnx_path = source.graph_path(graph)
    plan_bytes = build_engine(target, onnx_path, shapes, settings).plan
    if not plan.strongly_typed:
        _check_precision_applied(import_tensorrt(target), plan_bytes, plan.precision, onnx_path, shapes)
    (staging / plan_name(graph)).write_bytes(plan_bytes)
    return {"file": plan_name(graph), "sha256": file_sha256(staging / plan_name(graph)),
            "source_graph": source.entry(graph).file, "source_graph_sha256": source.entry(graph).sha256,
            "profile": {name: [list(s) for s in min_opt_max] for name, min_opt_max in shapes.items()}}


def _check_precision_applied(trt, plan_bytes: bytes, precision: str, onnx_path: Path,
                             shapes: Shapes) -> None:
    """Builder flags only allow a precision; an engine where TensorRT chose fp32 everywhere is refused.
    The inspector shows tensor formats only with an execution context whose input shapes are set."""
    engine = trt.Runtime(trt.Logger(trt.Logger.ERROR)).deserialize_cuda_engine(plan_bytes)
    if engine is None:
        raise TfmExportError(f"{onnx_path}: TensorRT cannot load the engine it just built; rebuild without "
                             "--weak-typing")
    context = engine.create_execution_context()
    for name, (_, opt, _) in shapes.items():
        context.set_input_shape(name, opt)
    inspector = engine.create_engine_inspector()
    inspector.execution_context = context
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    if precision not in layer_precisions(info):
        raise TfmExportError(f"{onnx_path}: TensorRT built no layer in {precision} with builder flags (it would be a "
                             "silent fp32 engine); build from the typed graphs instead (drop --weak-typing)")


def layer_precisions(info: dict[str, Any]) -> set[str]:
    """Precisions of the layer outputs in TensorRT's engine-inspector JSON ("Format/Datatype" in 10.x,
    "Datatype" in 11.x; fp16 is "Half" or "FP16", int8 "Int8")."""
    found = set()
    for layer in info.get("Layers", []):
        for output in layer.get("Outputs", []) if isinstance(layer, dict) else []:
            text = f"{output.get('Format/Datatype', '')} {output.get('Datatype', '')}".lower()
            found |= {name for name, words in INSPECTOR_NAMES.items() if any(w in text for w in words)}
    return found


def _engine_manifest(parent: ModelDir, model_dir: Path, source: ModelDir, plan: BuildPlan,
                     platform: Platform, limits: ShapeLimits, engines: dict[str, Any],
                     files: dict[str, str]) -> EngineManifest:
    return EngineManifest(
        format=ENGINE_FORMAT, format_version=ENGINE_FORMAT_VERSION, tool_version=__version__,
        **parent.manifest.tokens_of(), precision=plan.precision,
        limits={"max_batch": limits.max_batch, "max_source_length": limits.max_source_length,
                "max_target_length": limits.max_target_length},
        tensorrt={**platform.to_dict(), "precision_source": plan.precision_source,
                  "strongly_typed": plan.strongly_typed, "builder_flags": list(plan.flags),
                  "shape_limits": limits.to_dict()},
        engines=engines, files=files,
        source={"path": str(model_dir.resolve()), "precision": source.precision,
                "made_fp16_graphs": plan.make_fp16,
                "graphs_sha256": {g: source.entry(g).sha256 for g in source.graphs}})

