"""Shared by the tests that build real engines (TensorRT where it can build, else TensorRT-RTX without a GPU):
whether a builder is here, and the assertion that every graph a directory or an export offers TensorRT builds.

Which graphs those are is read from the graphs' own operators (standard ONNX domains only), not from the code
under test, so a graph that a new export lists is built here without a new test."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import onnx
import pytest

from tfm_export.artifacts.engine_dir import TENSORRT
from tfm_export.artifacts.model_dir import read_manifest
from tfm_export.core.config import ModelConfig
from tfm_export.core.graph_spec import CONTRACT_GRAPHS, Graph, all_specs
from tfm_export.runtime.tensorrt_platform import missing_reason
from tfm_export.trt.build_check import available_builder, check_builds
from tfm_export.trt.builder import build_engine
from tfm_export.trt.profiles import ShapeLimits, profile_shapes

BUILDER, NO_BUILDER = available_builder()
# Whether a builder should be found is judged without the code under test: TensorRT-RTX's package is installed
# (the rtx extra, part of dev), or TensorRT can build here.
RTX_INSTALLED = importlib.util.find_spec("tensorrt_rtx") is not None
needs_rtx = pytest.mark.skipif(not RTX_INSTALLED, reason="needs TensorRT-RTX: pip install 'tfm-export[rtx]'")
needs_builder = pytest.mark.skipif(not RTX_INSTALLED and missing_reason(TENSORRT) is not None,
                                   reason=f"needs a TensorRT builder (pip install 'tfm-export[rtx]' for TensorRT-RTX, "
                                          f"which builds without a GPU): {NO_BUILDER}")


def is_standard(proto: onnx.ModelProto) -> bool:
    return all(node.domain in ("", "ai.onnx") for node in proto.graph.node)


def standard_graphs(model_dir: Path) -> list[str]:
    """The listed graphs whose nodes are all standard ONNX operators."""
    manifest = read_manifest(model_dir)
    return sorted(name for name, entry in manifest["graphs"].items()
                  if is_standard(onnx.load_model(str(model_dir / entry["file"]), load_external_data=False)))


def assert_every_graph_builds(model_dir: Path) -> None:
    """`tfm-export check`'s builds: every standard-operator graph the directory lists, each built."""
    report = check_builds(model_dir)
    assert report.builder is not None, report.lines()
    assert sorted(b.graph for b in report.builds) == standard_graphs(model_dir), report.lines()
    assert report.failures() == [] and all(b.plan_bytes > 0 for b in report.builds), report.lines()


def assert_exported_graphs_build(graphs: dict[Graph, onnx.ModelProto], config: ModelConfig,
                                 work: Path) -> None:
    """Every standard-operator graph of an export (graphs.export.export_all), built at `tfm-export trt`'s profiles."""
    specs = all_specs(config)
    limits = ShapeLimits().resolved(config.n_position)
    standard = [graph for graph, proto in graphs.items() if is_standard(proto)]
    assert set(CONTRACT_GRAPHS) <= set(standard)
    for graph in standard:
        onnx.save_model(graphs[graph], str(work / graph.filename))
        assert build_engine(BUILDER, work / graph.filename, profile_shapes(specs[graph], limits)).plan
