"""TensorRT-RTX: a real TensorRT builder on a machine without a GPU.

The demo's fp32/fp16/int8 static graphs are parsed into strongly typed networks and built at `tfm-export trt`'s
profiles, the builder itself the oracle (the variant presets and the Hugging Face families are built beside
their own exports, through tests/support/builder.py). `check` names the builder and its result per graph, and
fails on a graph the parser refuses. Engine directories built on the CPU are held to their manifest and hashes
like every other directory; running them needs a GPU TensorRT-RTX supports (compute capability 8.0, 8.6, 8.9,
12.0+), and those tests skip elsewhere.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import onnx
import pytest
import torch
from click.testing import CliRunner
from support.builder import (
    BUILDER,
    RTX_INSTALLED,
    assert_every_graph_builds,
    needs_builder,
    needs_rtx,
    standard_graphs,
)
from support.common import listing
from support.tensorrt import ENGINE_FLOORS, greedy_agreement_with_pytorch

from tfm_export.artifacts.engine_dir import RTX, TARGET_NAMES, TENSORRT, read_engine_manifest
from tfm_export.artifacts.manifest import write_manifest
from tfm_export.artifacts.model_dir import read_manifest
from tfm_export.cli.export_cli import main as export_main
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core.config import ModelConfig
from tfm_export.core.errors import TfmExportError
from tfm_export.core.files import file_sha256
from tfm_export.core.graph_spec import CONTRACT_GRAPHS, contract_specs
from tfm_export.runtime.tensorrt_platform import (
    RTX_RUNS_ON,
    Platform,
    TensorRTUnavailable,
    check_gpu_supported,
    engine_mismatch,
    import_tensorrt,
    missing_reason,
    rtx_runs_on,
)
from tfm_export.runtime.translator import Translator
from tfm_export.trt.build import build_engines
from tfm_export.trt.build_check import check_builds
from tfm_export.trt.profiles import ShapeLimits, profile_shapes

RTX_GPU_MISSING = missing_reason(RTX) if RTX_INSTALLED else "TensorRT-RTX is not installed"
needs_rtx_gpu = pytest.mark.skipif(RTX_GPU_MISSING is not None,
                                   reason=f"needs a GPU TensorRT-RTX runs on: {RTX_GPU_MISSING}")
GPU_CC = "{}.{}".format(*torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else None
LIMITS = ShapeLimits(max_batch=16, max_source_length=64, max_target_length=64)


# --- every graph kind the project emits for TensorRT ----------------------------------------------------------------

@needs_builder
@pytest.mark.parametrize("precision", ["fp32", "fp16", "fp16-io", "int8-static"])
def test_demo_graphs_build(variants, precision):
    """The demo is the classic preset; the other presets and every option are built in test_variants_export, the
    Hugging Face families in test_huggingface."""
    assert_every_graph_builds(variants[precision])


@needs_builder
def test_a_graph_with_an_op_tensorrt_lacks_fails_check(demo_onnx, tmp_path):
    """ONNX Runtime's offline fusions (com.microsoft SkipLayerNormalization) in the encoder: the parser refuses
    the node and `check` fails, naming it."""
    from onnxruntime.transformers.optimizer import optimize_model
    model = tmp_path / "model"
    shutil.copytree(demo_onnx, model)
    cfg = ModelConfig.from_dict(read_manifest(model)["model"])
    fused = optimize_model(str(model / "encoder.onnx"), model_type="bert", num_heads=cfg.n_head,
                           hidden_size=cfg.d_model, opt_level=1).model
    onnx.save_model(fused, str(model / "encoder.onnx"))
    manifest = read_manifest(model)
    manifest["graphs"]["encoder"]["sha256"] = file_sha256(model / "encoder.onnx")
    write_manifest(model, manifest)
    failed = check_builds(model).failures()
    assert [b.graph for b in failed] == ["encoder"], failed
    assert "ONNX parser refused it" in failed[0].problem and "SkipLayerNormalization" in failed[0].problem
    result = CliRunner().invoke(export_main, ["check", "--model", str(model)])
    assert result.exit_code == 1 and "1 failed build(s)" in result.output.splitlines()[-1], result.output
    assert "encoder               FAILED:" in result.output


def test_check_without_a_builder_says_so(variants, monkeypatch):
    """Neither TensorRT nor TensorRT-RTX importable: the op-list verdicts stand alone, and the report says so."""
    for module in ("tensorrt", "tensorrt_rtx"):
        monkeypatch.setitem(sys.modules, module, None)  # `import` raises ImportError, as without the package
    result = CliRunner().invoke(export_main, ["check", "--model", str(variants["int8-static"])])
    assert result.exit_code == 0 and result.output.strip().endswith("check OK"), result.output
    line = next(x for x in result.output.splitlines() if x.startswith("Builds:"))
    assert "none ran" in line and "TensorRT is not installed" in line and "TensorRT-RTX is not installed" in line


@needs_builder
def test_check_names_the_builder_and_its_result_per_graph(variants):
    result = CliRunner().invoke(export_main, ["check", "--model", str(variants["int8-static"])])
    assert result.exit_code == 0, result.output
    builder = f"{TARGET_NAMES[BUILDER]} {import_tensorrt(BUILDER).__version__}"
    assert f"Builds by {builder} (a real builder ran" in result.output
    assert "static TensorRT compatibility (from the ONNX parsers' documented operators" in result.output
    for graph in standard_graphs(variants["int8-static"]):
        assert any(x.startswith(f"  {graph} ") and " built: " in x for x in result.output.splitlines()), graph


# --- engine directories built without a GPU --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rtx_engines(variants, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rtx-engines")
    made = {}
    for name, source, precision in (("fp32", "fp32", None), ("fp16", "fp32", "fp16"), ("int8", "int8-static", None)):
        build_engines(variants[source], root / name, precision, LIMITS, progress=False, target=RTX)
        made[name] = root / name
    return made


@needs_rtx
@pytest.mark.parametrize("name, source, precision", [("fp32", "fp32", "fp32"), ("fp16", "fp32", "fp16"),
                                                     ("int8", "int8-static", "int8")])
def test_rtx_engine_manifest_records_the_build(rtx_engines, variants, name, source, precision):
    directory = rtx_engines[name]
    manifest = read_engine_manifest(directory)
    built = manifest["tensorrt"]
    assert (built["target"], built["tensorrt"]) == (RTX, import_tensorrt(RTX).__version__)
    assert built["gpu"] is None and built["runs_on_compute_capabilities"] == RTX_RUNS_ON
    assert manifest["precision"] == precision and built["strongly_typed"] and built["builder_flags"] == []
    assert manifest["source"]["made_fp16_graphs"] is (name == "fp16")
    assert manifest["limits"] == {"max_batch": 16, "max_source_length": 64, "max_target_length": 64}
    specs = contract_specs(ModelConfig.from_dict(manifest["model"]))
    assert sorted(manifest["engines"]) == sorted(g.value for g in CONTRACT_GRAPHS)
    for graph in CONTRACT_GRAPHS:
        entry = manifest["engines"][graph.value]
        assert file_sha256(directory / entry["file"]) == entry["sha256"] and (directory / entry["file"]).stat().st_size
        want = {k: [list(s) for s in v] for k, v in profile_shapes(specs[graph], LIMITS.resolved(200)).items()}
        assert entry["profile"] == want
        if name != "fp16":  # fp16 engines are built from graphs made on the way, not kept
            assert entry["source_graph_sha256"] == read_manifest(variants[source])["graphs"][graph.value]["sha256"]
    assert sorted(p.name for p in directory.iterdir()) == ["decoder_step.plan", "encoder.plan", "manifest.json",
                                                          "tokenizer.json"]


@needs_rtx
def test_trt_target_rtx_builds_on_the_cpu_from_the_command_line(demo_onnx, tmp_path):
    result = CliRunner().invoke(export_main, ["trt", "--model", str(demo_onnx), "--target", "rtx", "--max-batch", "4",
                                              "--output", str(tmp_path / "engines")])
    assert result.exit_code == 0, result.output
    assert "fp32 engines (graph (strongly typed)), TensorRT-RTX" in result.output
    assert "built without a GPU (its engines run on compute capability 8.0, 8.6, 8.9, 12.0+)" in result.output
    assert read_engine_manifest(tmp_path / "engines")["limits"]["max_batch"] == 4


@needs_rtx
def test_what_tensorrt_rtx_cannot_do_is_refused_before_anything_is_written(demo_onnx, tmp_path):
    for args, message in ((["--weak-typing"], "--weak-typing: TensorRT-RTX has no builder precision flags"),
                          (["--timing-cache", str(tmp_path / "cache")],
                           "--timing-cache: TensorRT-RTX builds take none")):
        result = CliRunner().invoke(export_main, ["trt", "--model", str(demo_onnx), "--target", "rtx", *args,
                                                  "--output", str(tmp_path / "engines")])
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
        assert message in result.output
    assert listing(tmp_path) == []


def _copy(directory: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(directory, tmp_path / directory.name))


def _edit(directory: Path, edit) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    edit(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))


def _translate(directory: Path):
    return CliRunner().invoke(run_main, ["translate", "--model", str(directory), "forty-two"])


def _one_line(result, fragment: str) -> None:
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert fragment in result.output and "Traceback" not in result.output, result.output


@needs_rtx
def test_hostile_rtx_engine_directories_are_one_line_errors(rtx_engines, tmp_path):
    """Verified wherever they are opened, before a GPU is sought: a truncated plan, another graph's plan, a manifest
    that names an unknown target or bad limits. A manifest naming TensorRT sends the plans to TensorRT, which is
    not here (with it, the plan would be refused as one TensorRT cannot load)."""
    cases = {
        "truncated plan": (lambda d: (d / "encoder.plan").write_bytes((d / "encoder.plan").read_bytes()[:1000]),
                           "encoder.plan: sha256 differs from manifest.json"),
        "another graph's plan": (lambda d: shutil.copyfile(d / "decoder_step.plan", d / "encoder.plan"),
                                 "encoder.plan: sha256 differs from manifest.json"),
        "unknown target": (lambda d: _edit(d, lambda m: m["tensorrt"].update(target="tensorrt-llm")),
                           "has an invalid tensorrt.target; build the engines again"),
        "no target": (lambda d: _edit(d, lambda m: m["tensorrt"].pop("target")), "lacks tensorrt.target"),
        "bad limits": (lambda d: _edit(d, lambda m: m["limits"].update(max_batch=0)),
                       "has an invalid limits.max_batch"),
        "TensorRT named": (lambda d: _edit(d, lambda m: m["tensorrt"].update(target=TENSORRT)),
                           "TensorRT is not installed" if missing_reason(TENSORRT) else "TensorRT"),
    }
    for name, (damage, message) in cases.items():
        directory = _copy(rtx_engines["int8"], tmp_path / name.replace(" ", "-"))
        damage(directory)
        _one_line(_translate(directory), message)


@needs_rtx
@pytest.mark.skipif(GPU_CC is not None, reason="a GPU is visible: the GPU tests cover what happens there")
def test_rtx_engines_without_a_gpu_say_why_in_one_line(rtx_engines):
    _one_line(_translate(rtx_engines["fp32"]), "no CUDA GPU is visible")


@needs_rtx
def test_triton_runs_rtx_engines_through_the_runtime_only(rtx_engines, tmp_path):
    """Triton's TensorRT backend loads TensorRT plans only: the bls layout (native plan models) is refused; the
    translator layout carries the engine directory for tfm-export's runtime."""
    engines = rtx_engines["fp16"]
    result = CliRunner().invoke(export_main, ["triton", "--model", str(engines), "--output", str(tmp_path / "bls"),
                                              "--layout", "bls"])
    _one_line(result, "TensorRT-RTX engines; Triton's TensorRT backend loads TensorRT plans only")
    result = CliRunner().invoke(export_main, ["triton", "--model", str(engines), "--output", str(tmp_path / "repo")])
    assert result.exit_code == 0, result.output
    copied = tmp_path / "repo" / "translator" / "1" / "model"
    assert read_engine_manifest(copied)["tensorrt"]["target"] == RTX
    assert file_sha256(copied / "encoder.plan") == file_sha256(engines / "encoder.plan")


def test_where_tensorrt_rtx_engines_run():
    """TensorRT-RTX's default build runs on 8.0, 8.6, 8.9 and 12.0+; Turing needs a build of its own, Hopper and
    Blackwell data-centre GPUs (10.x) none; the recorded version must match exactly."""
    assert [cc for cc in ("7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "12.0", "12.1") if rtx_runs_on(cc)] == \
        ["8.0", "8.6", "8.9", "12.0", "12.1"]
    check_gpu_supported(Platform("1.7.1.116", "NVIDIA GeForce RTX 4090", "8.9", RTX))
    with pytest.raises(TensorRTUnavailable, match=r"NVIDIA H200 \(compute capability 9.0\): TensorRT-RTX does not run "
                                                  "on it .*`tfm-export trt --target tensorrt`"):
        check_gpu_supported(Platform("1.7.1.116", "NVIDIA H200", "9.0", RTX))
    recorded = {"target": RTX, "tensorrt": "1.6.0.1", "gpu": None, "compute_capability": None}
    assert "built with TensorRT-RTX 1.6.0.1, this machine has TensorRT-RTX 1.7.1.116" in engine_mismatch(
        recorded, Platform("1.7.1.116", "NVIDIA RTX A6000", "8.6", RTX))
    same = {**recorded, "tensorrt": "1.7.1.116"}
    assert engine_mismatch(same, Platform("1.7.1.116", "NVIDIA GeForce RTX 5090", "12.0", RTX)) is None


# --- on a GPU (skipped elsewhere) -----------------------------------------------------------------------------------

@needs_rtx_gpu
@pytest.mark.parametrize("name, floor", ENGINE_FLOORS)
def test_rtx_engines_translate_like_pytorch(rtx_engines, name, floor):
    assert greedy_agreement_with_pytorch(rtx_engines[name], 200) >= floor


@needs_rtx_gpu
def test_a_damaged_plan_that_matches_its_manifest_is_refused_by_the_runtime(rtx_engines, tmp_path):
    directory = _copy(rtx_engines["fp32"], tmp_path)
    (directory / "encoder.plan").write_bytes((directory / "encoder.plan").read_bytes()[:1000])
    _edit(directory, lambda m: m["engines"]["encoder"].update(sha256=file_sha256(directory / "encoder.plan")))
    with pytest.raises(TfmExportError, match="TensorRT-RTX .* cannot load this engine"):
        Translator.load(directory)


@needs_rtx
@pytest.mark.skipif(GPU_CC is None or rtx_runs_on(GPU_CC), reason="needs a GPU TensorRT-RTX does not run on (Hopper)")
def test_rtx_engines_on_a_gpu_tensorrt_rtx_refuses_are_one_line(rtx_engines):
    _one_line(_translate(rtx_engines["fp32"]), "TensorRT-RTX does not run on it")
