"""`tfm-export check`'s real builds: every graph a directory lists as TensorRT-ready, parsed into a strongly
typed network and built at the optimisation profiles `tfm-export trt` uses by default.

The builder is TensorRT where it can build here (installed, with a GPU it supports), else TensorRT-RTX,
whose builder needs no GPU and shares TensorRT's ONNX parser family. Neither is TensorRT 8.6, 10.3 or 11:
for those, compat's static report (the parsers' documented operators and rules) is the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..artifacts.engine_dir import RTX, TARGET_NAMES, TENSORRT
from ..artifacts.model_dir import ModelDir
from ..core.graph_spec import tensorrt_specs
from ..runtime.tensorrt_platform import TensorRTUnavailable, import_tensorrt, missing_reason
from .builder import BuildError, build_engine
from .profiles import ShapeLimits, profile_shapes


@dataclass(frozen=True)
class GraphBuild:
    graph: str
    problem: str | None  # None: built
    seconds: float = 0.0
    plan_bytes: int = 0
    warnings: int = 0

    def line(self) -> str:
        if self.problem:
            return f"  {self.graph:21} FAILED: {self.problem}"
        said = f", {self.warnings} warning(s) (`tfm-export -v check` shows them)" if self.warnings else ""
        return f"  {self.graph:21} built: {self.plan_bytes / 1e6:.1f} MB plan in {self.seconds:.2f} s{said}"


@dataclass(frozen=True)
class BuildReport:
    builder: str | None  # e.g. "TensorRT-RTX 1.7.1.116"; None: no builder could run here
    others: str  # why the other builders did not run
    builds: tuple[GraphBuild, ...]

    def failures(self) -> list[GraphBuild]:
        return [b for b in self.builds if b.problem]

    def lines(self) -> list[str]:
        if self.builder is None:
            return [f"Builds: none ran, no TensorRT builder can run here ({self.others}); the verdicts above are "
                    "from the op lists only"]
        also = f"; {self.others}" if self.others else ""
        return [f"Builds by {self.builder} (a real builder ran: strongly typed, at `tfm-export trt`'s default "
                f"profiles){also}:", *(b.line() for b in self.builds)]


def available_builder() -> tuple[str | None, str]:
    """TENSORRT where it can build here, else RTX where installed, else None; and why the others cannot."""
    tensorrt = missing_reason(TENSORRT)
    if tensorrt is None:
        return TENSORRT, ""
    try:
        import_tensorrt(RTX)
    except TensorRTUnavailable as exc:
        return None, f"{tensorrt}; {str(exc).split(';')[0]}"
    return RTX, tensorrt


def check_builds(model_dir: Path) -> BuildReport:
    """Build every TensorRT-ready graph of the directory with the builder available here; a graph the builder
    refuses is a failed build with the builder's own words, not an exception."""
    directory = ModelDir.read(model_dir)
    target, others = available_builder()
    if target is None:
        return BuildReport(None, others, ())
    limits = ShapeLimits().resolved(directory.config.n_position)
    builds = []
    for graph, spec in tensorrt_specs(directory.config, directory.graphs).items():
        path = directory.graph_path(graph)
        try:
            built = build_engine(target, path, profile_shapes(spec, limits))
        except BuildError as exc:
            builds.append(GraphBuild(graph.value, str(exc)))
            continue
        builds.append(GraphBuild(graph.value, None, built.seconds, len(built.plan), len(built.warnings)))
    builder = f"{TARGET_NAMES[target]} {import_tensorrt(target).__version__}"
    return BuildReport(builder, others, tuple(builds))
