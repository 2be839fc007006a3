"""TensorRT: the static compatibility report and Polygraphy runs (any machine), the build and runtime's
decisions and errors (any machine), and real engines against PyTorch (only with TensorRT and a GPU). The TensorRT
backend's tests (runtime/backends/tensorrt.py, its buffers in runtime/backends/pingpong.py) live here, beside the
engines and the four-precision fixture they share."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper
from support.common import DEMO_CKPT, listing, modules_after
from support.tensorrt import ENGINE_FLOORS, cache_handling_backend, greedy_agreement_with_pytorch

from tfm_export.artifacts.engine_dir import read_engine_manifest
from tfm_export.artifacts.manifest import ENGINE_FORMAT, ENGINE_FORMAT_VERSION, write_manifest
from tfm_export.artifacts.model_dir import read_manifest
from tfm_export.cli.export_cli import main as export_main
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core.config import ModelConfig
from tfm_export.core.errors import TfmExportError
from tfm_export.core.files import file_sha256
from tfm_export.core.graph_spec import CONTRACT_GRAPHS, Graph, contract_specs
from tfm_export.demo import numbers as demo_numbers
from tfm_export.runtime.search import LoopSearcher
from tfm_export.runtime.tensorrt_platform import (
    Platform,
    TensorRTUnavailable,
    check_gpu_supported,
    current_platform,
    engine_mismatch,
    missing_reason,
)
from tfm_export.runtime.translator import DecodeOptions, Translator
from tfm_export.trt.build import layer_precisions, plan_build
from tfm_export.trt.compat import check_model_dir, graph_findings
from tfm_export.trt.polygraphy_check import check_onnxruntime
from tfm_export.trt.profiles import ShapeLimits, profile_shapes

MISSING = missing_reason()
needs_tensorrt = pytest.mark.skipif(MISSING is not None, reason=f"needs TensorRT and an NVIDIA GPU: {MISSING}")
without_tensorrt = pytest.mark.skipif(MISSING is None, reason="TensorRT is present: the real engine tests cover this")
TRT_PRECISIONS = ("fp32", "fp16", "int8-static")


# --- static compatibility report -------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", TRT_PRECISIONS)
def test_demo_graphs_are_compatible_with_tensorrt_8_6_10_3_and_11(variants, precision):
    report = check_model_dir(variants[precision])
    assert report.releases == ("TensorRT 8.6", "TensorRT 10.3", "TensorRT 11")
    assert report.errors() == [], report.lines()


@pytest.mark.slow
@pytest.mark.parametrize("precision", TRT_PRECISIONS)
def test_base_graphs_are_compatible_with_tensorrt(base_variants, precision):
    assert check_model_dir(base_variants[precision]).errors() == []


def test_dynamic_int8_graphs_are_reported_incompatible(variants):
    report = check_model_dir(variants["int8-dynamic"])
    messages = " ".join(f.message for f in report.errors("TensorRT 11"))
    assert "DynamicQuantizeLinear is not supported" in messages and "MatMulInteger is not supported" in messages


def _load(directory: Path, graph: Graph) -> onnx.ModelProto:
    return onnx.load_model(str(directory / graph.filename))


def _spec(directory: Path, graph: Graph):
    return contract_specs(ModelConfig.from_dict(read_manifest(directory)["model"]))[graph]


def test_onnxruntime_contrib_fusions_are_reported(demo_onnx):
    """ONNX Runtime's offline optimizer (why export does not save its output): com.microsoft ops."""
    from onnxruntime.transformers.optimizer import optimize_model
    cfg = ModelConfig.from_dict(read_manifest(demo_onnx)["model"])
    fused = optimize_model(str(demo_onnx / "encoder.onnx"), model_type="bert", num_heads=cfg.n_head,
                           hidden_size=cfg.d_model, opt_level=1).model
    messages = [f.message for f in graph_findings(fused, _spec(demo_onnx, Graph.ENCODER)) if f.level == "error"]
    assert any("com.microsoft.SkipLayerNormalization is not a standard ONNX op" in m for m in messages), messages


def test_nonzero_zero_points_are_reported(variants):
    proto = _load(variants["int8-static"], Graph.DECODER_STEP)
    zero = next(i for i in proto.graph.initializer if i.data_type == onnx.TensorProto.INT8 and
                i.name.endswith("zero_point"))
    zero.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(zero) + 3, zero.name))
    errors = [f.message for f in graph_findings(proto, _spec(variants["int8-static"], Graph.DECODER_STEP))
              if f.level == "error"]
    assert errors and all("zero point must be int8 zeros" in m for m in errors)


def test_control_flow_fixed_axes_and_opset_are_reported(demo_onnx):
    proto = _load(demo_onnx, Graph.DECODER_STEP)
    branch = lambda value: helper.make_graph(  # noqa: E731
        [helper.make_node("Constant", [], [f"c{value}"], value=numpy_helper.from_array(np.array([value], np.int64)))],
        f"b{value}", [], [helper.make_tensor_value_info(f"c{value}", onnx.TensorProto.INT64, [1])])
    proto.graph.initializer.append(numpy_helper.from_array(np.array(True), "flag"))
    proto.graph.node.append(helper.make_node("If", ["flag"], ["unused"], then_branch=branch(1), else_branch=branch(0),
                                             name="merged_decoder"))
    past = next(i for i in proto.graph.input if i.name.startswith("past_key_values.0.decoder.key"))
    past.type.tensor_type.shape.dim[2].dim_value = 16  # a fixed past length: no profile range, no first step
    next(o for o in proto.opset_import if o.domain == "").version = 22
    found = graph_findings(proto, _spec(demo_onnx, Graph.DECODER_STEP))
    text = [f"{f.release}: {f.message}" for f in found if f.level == "error"]
    assert any("contract: If node 'merged_decoder'" in t for t in text), text
    assert any("contract: input 'past_key_values.0.decoder.key' has axes" in t for t in text), text
    assert any(t.startswith("TensorRT 10.3: opset 22 is outside") for t in text), text
    assert any(t.startswith("TensorRT 8.6: opset 22 is outside the parser's 9..17") for t in text), text
    assert not any(t.startswith("TensorRT 11: opset") for t in text), text


# --- Polygraphy runs on generated inputs ---------------------------------------------------------------------------

@pytest.mark.parametrize("precision", TRT_PRECISIONS)
def test_polygraphy_onnxruntime_runs_pass_on_the_demo(variants, precision):
    results = check_onnxruntime(variants[precision])
    graphs = set(read_manifest(variants[precision])["graphs"])
    # decoder_step_search too (its write, rules and TopK); the fused one (ONNX Runtime's kernels) is not TensorRT's
    assert {r.graph for r in results} == graphs - {"decoder_step_search_fused"}
    assert any("past 0" in r.case for r in results) and any("past 199" in r.case for r in results)
    assert [r for r in results if r.problem] == []


@pytest.mark.slow
@pytest.mark.parametrize("precision", TRT_PRECISIONS)
def test_polygraphy_onnxruntime_runs_pass_on_the_base_config(base_variants, precision):
    assert [r for r in check_onnxruntime(base_variants[precision]) if r.problem] == []


def _rehash(directory: Path, graph: Graph) -> None:
    manifest = read_manifest(directory)
    manifest["graphs"][graph.value]["sha256"] = file_sha256(directory / graph.filename)
    write_manifest(directory, manifest)


def test_polygraphy_run_catches_non_finite_logits(demo_onnx, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(demo_onnx, broken)
    proto = _load(broken, Graph.DECODER_STEP)
    producer = next(n for n in proto.graph.node if "logits" in n.output)
    producer.output[list(producer.output).index("logits")] = "logits_raw"
    proto.graph.initializer.append(numpy_helper.from_array(np.array(np.nan, np.float32), "nan"))
    proto.graph.node.append(helper.make_node("Mul", ["logits_raw", "nan"], ["logits"]))
    onnx.save_model(proto, str(broken / Graph.DECODER_STEP.filename))
    _rehash(broken, Graph.DECODER_STEP)
    failed = [r for r in check_onnxruntime(broken) if r.problem]
    assert failed and all(r.graph == "decoder_step" and "logits has non-finite values" in r.problem for r in failed)
    result = CliRunner().invoke(export_main, ["check", "--model", str(broken)])
    assert result.exit_code == 1 and "failed run(s)" in result.output.splitlines()[-1]


def test_check_command_reports_and_exits(variants):
    ok = CliRunner().invoke(export_main, ["check", "--model", str(variants["int8-static"])])
    assert ok.exit_code == 0, ok.output
    assert "TensorRT 10.3: compatible" in ok.output and ok.output.strip().endswith("check OK")
    bad = CliRunner().invoke(export_main, ["check", "--model", str(variants["int8-dynamic"])])
    assert bad.exit_code == 1 and "compatibility problem(s)" in bad.output.splitlines()[-1]


# --- build decisions, profiles, platforms (pure logic, any machine) ---------------------------------------------

@pytest.mark.parametrize("source, mode, precision, major, weak, expect", [
    ("fp32", None, "fp32", 10, False, ("fp32", True, False, ())),
    ("fp32", None, "fp16", 11, False, ("fp16", True, True, ())),
    ("fp32", None, "fp16", 10, True, ("fp16", False, False, ("fp16",))),
    ("fp16", None, "fp16", 11, False, ("fp16", True, False, ())),
    ("int8", "static", "int8", 11, False, ("int8", True, False, ())),
    ("int8", "static", "int8", 10, True, ("int8", False, False, ("int8", "fp16"))),
])
def test_build_plans(source, mode, precision, major, weak, expect):
    plan = plan_build(source, mode, precision, major, weak)
    assert (plan.precision, plan.strongly_typed, plan.make_fp16, plan.flags) == expect


@pytest.mark.parametrize("source, mode, precision, major, weak, message", [
    ("fp32", None, "fp16", 11, True, "TensorRT 11 removed builder precision flags"),
    ("fp32", None, "int8", 10, False, "--int8 needs an int8 static directory"),
    ("int8", "dynamic", "int8", 10, False, "this int8 directory is dynamic"),
    ("fp16", None, "fp32", 10, False, "this directory is fp16"),
    ("fp32", None, "bf16", 10, False, "unknown precision 'bf16'"),
])
def test_build_requests_that_cannot_be_applied_are_errors(source, mode, precision, major, weak, message):
    with pytest.raises(TfmExportError, match=message):
        plan_build(source, mode, precision, major, weak)


def test_profiles_cover_every_shape_the_runtime_feeds():
    cfg = ModelConfig(src_vocab_size=100, trg_vocab_size=100, d_model=64, n_head=4, d_k=16, d_v=8, n_layers=2,
                      n_position=50)
    limits = ShapeLimits(max_batch=16, max_source_length=20, max_target_length=50)
    limits.check(50)
    step = profile_shapes(contract_specs(cfg)[Graph.DECODER_STEP], limits)
    assert step["input_ids"] == ((1, 1), (8, 1), (16, 1))
    assert step["encoder_attention_mask"] == ((1, 1), (8, 20), (16, 20))  # the default opt (32) within the max
    assert step["past_key_values.1.decoder.value"] == ((1, 4, 0, 8), (8, 4, 32, 8), (16, 4, 49, 8))
    assert step["past_key_values.0.encoder.key"] == ((1, 4, 1, 16), (8, 4, 20, 16), (16, 4, 20, 16))
    with pytest.raises(TfmExportError, match="--opt-source-length 64 is outside 1..20"):
        ShapeLimits(max_source_length=20, max_target_length=50, opt_source_length=64).check(50)
    enc = profile_shapes(contract_specs(cfg)[Graph.ENCODER], limits)
    assert set(enc) == {"input_ids", "attention_mask"}
    with pytest.raises(TfmExportError, match="--max-target-length 60 is outside 2..50"):
        ShapeLimits(max_source_length=50, max_target_length=60).check(50)


def test_engines_from_another_platform_are_refused_with_a_rebuild_hint():
    built = {"tensorrt": "10.3.0.30", "gpu": "Orin", "compute_capability": "8.7"}
    assert engine_mismatch(built, Platform("10.3.0.30", "Orin (64GB)", "8.7")) is None
    assert "TensorRT 10.3.0.30, this machine has TensorRT 11.4.0" in engine_mismatch(
        built, Platform("11.4.0", "Orin", "8.7"))
    assert "compute capability 8.7 (Orin), this GPU is 9.0" in engine_mismatch(built, Platform("10.3.0.30", "H100",
                                                                                              "9.0"))
    check_gpu_supported(Platform("10.3.0.30", "Orin", "8.7"))
    with pytest.raises(TensorRTUnavailable, match="older than TensorRT 10.3.0.30 supports"):
        check_gpu_supported(Platform("10.3.0.30", "Tesla P100", "6.0"))


def test_weak_typing_precision_is_read_from_the_inspector_json():
    """The layer-information JSON as TensorRT 10 ("Format/Datatype") and 11 ("Datatype") write it."""
    trt10 = {"Layers": [{"Name": "a", "Outputs": [{"Name": "x", "Format/Datatype": "Row major linear FP32"}]},
                        {"Name": "b", "Outputs": [{"Name": "y", "Format/Datatype": "Row major linear FP16 format"}]}]}
    trt11 = {"Layers": [{"Name": "q", "Outputs": [{"Name": "z", "Datatype": "Int8", "Format": "Row major linear"}]},
                        "a layer name only (ProfilingVerbosity.LAYER_NAMES_ONLY)"]}
    assert layer_precisions(trt10) == {"fp16"} and layer_precisions(trt11) == {"int8"}
    assert layer_precisions({"Layers": [{"Outputs": [{"Format/Datatype": "Row major linear FP32"}]}]}) == set()


# --- the TensorRT backend's own cache handling, on the CPU ------------------------------------------------------

@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_trt_backend_cache_handling_decodes_like_onnxruntime(variants, precision):
    backend, reference = cache_handling_backend(variants[precision])
    translator = Translator(LoopSearcher(backend), reference.vocab, reference.config, backend.limits)
    texts = [en for en, _ in demo_numbers.held_out_pairs()[:120]] + ["forty-two", "", "one"]
    for options in (DecodeOptions(batch_size=16), DecodeOptions(beam_size=4, batch_size=32)):
        got = translator.translate(texts, options)
        want = reference.translate(texts, options)
        assert [g.ids for g in got] == [w.ids for w in want]
        assert np.allclose([g.score for g in got], [w.score for w in want], atol=1e-4)
    made = []  # PingPong buffer sets: once per decode and once when beam search widens it, never per step
    allocate = backend._cache
    backend._cache = lambda rows: made.append(rows) or allocate(rows)
    translator.translate(texts[:8], DecodeOptions(beam_size=2))
    assert made == [8, 16]


def test_the_trt_backend_imports_no_torch():
    """The TensorRT backend keeps its buffers in ONNX Runtime's CUDA memory: opening and decoding need no PyTorch
    (checked on the module graph: the backend and everything it imports)."""
    code = ("import tfm_export.runtime.backends.tensorrt, tfm_export.runtime.tensorrt_platform\n"
            "import tfm_export.runtime.backends as b\nb.BACKENDS['tensorrt']")
    assert "torch" not in modules_after(code)


# --- without TensorRT: one line, nothing written ---------------------------------------------------------------

def test_trt_build_requests_are_checked_before_tensorrt_is_needed(variants, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    for args, message in ((["--model", str(variants["fp32"]), "--int8"], "--int8 needs an int8 static directory"),
                          (["--model", str(variants["int8-dynamic"])], "this int8 directory is dynamic"),
                          (["--model", str(variants["fp32"]), "--fp16", "--int8"], "--fp16 and --int8 exclude"),
                          (["--model", str(variants["fp32"]), "--opt-past-length", "500"],
                           "--opt-past-length 500 is outside 0..199"),
                          (["--model", str(variants["fp32"]), "--max-target-length", "201"], "outside 2..200"),
                          (["--model", str(variants["fp32"]), "--output", str(tmp_path / "full")],
                           "directory is not empty; pass --force")):
        output = [] if "--output" in args else ["--output", str(tmp_path / "engines")]
        result = CliRunner().invoke(export_main, ["trt", *args, *output])
        assert result.exit_code == 1 and message in result.output, (args, result.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


@without_tensorrt
def test_trt_build_without_tensorrt_is_one_line_and_writes_nothing(demo_onnx, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args in (["trt", "--model", str(demo_onnx), "--fp16", "--output", "engines"],
                 ["check", "--model", str(demo_onnx), "--trt"]):
        result = CliRunner().invoke(export_main, args)
        assert result.exit_code == 1, result.output
        assert len(result.output.strip().splitlines()) == 1 and "TensorRT is not installed" in result.output
        assert "Traceback" not in result.output and listing(tmp_path) == []


def _fake_engine_dir(directory: Path, demo_onnx: Path) -> Path:
    """A manifest with stand-in plan bytes: enough to test routing and errors, never run."""
    directory.mkdir()
    manifest = read_manifest(demo_onnx)
    engines = {}
    for graph in CONTRACT_GRAPHS:
        (directory / f"{graph.value}.plan").write_bytes(f"plan of {graph.value}".encode())
        engines[graph.value] = {"file": f"{graph.value}.plan", "sha256": file_sha256(directory / f"{graph.value}.plan")}
    (directory / "manifest.json").write_text(json.dumps({
        "format": ENGINE_FORMAT, "format_version": ENGINE_FORMAT_VERSION, "model": manifest["model"],
        "tokenizer": manifest["tokenizer"], "files": manifest["files"], "special_tokens": manifest["special_tokens"],
        "limits": {"max_batch": 8, "max_source_length": 200, "max_target_length": 200}, "precision": "fp16",
        "tensorrt": {"target": "tensorrt", "tensorrt": "10.3.0.30", "gpu": "Orin", "compute_capability": "8.7"},
        "engines": engines, "source": {}}))
    return directory


@without_tensorrt
def test_translate_on_engines_without_tensorrt_is_one_line(demo_onnx, tmp_path):
    engines = _fake_engine_dir(tmp_path / "engines", demo_onnx)
    for args, message in ((["--model", str(engines)], "TensorRT is not installed"),
                          (["--model", str(demo_onnx), "--backend", "tensorrt"], "is not a TensorRT engine directory")):
        result = CliRunner().invoke(run_main, ["translate", *args, "forty-two"])
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
        assert message in result.output
    result = CliRunner().invoke(run_main, ["translate", "--model", str(engines), "--backend", "onnxruntime", "x"])
    assert result.exit_code == 1 and "holds TensorRT engines; run it with --backend tensorrt" in result.output
    result = CliRunner().invoke(run_main, ["translate", "--model", str(engines), "--device", "cpu", "x"])
    assert result.exit_code == 1 and "TensorRT engines run on the GPU; drop --device cpu" in result.output


def test_engine_manifests_are_checked(demo_onnx, tmp_path):
    engines = _fake_engine_dir(tmp_path / "engines", demo_onnx)
    assert read_engine_manifest(engines)["precision"] == "fp16"
    with pytest.raises(TfmExportError, match="not a tfm-export-engines manifest"):
        read_engine_manifest(demo_onnx)
    data = json.loads((engines / "manifest.json").read_text())
    del data["tensorrt"]
    (engines / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(TfmExportError, match="lacks tensorrt.target, tensorrt.tensorrt; build the engines again"):
        read_engine_manifest(engines)


# --- real engines (TensorRT and a GPU) -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engines(variants, tmp_path_factory) -> dict[str, Path]:
    from tfm_export.trt.build import build_engines
    root = tmp_path_factory.mktemp("engines")
    cache = root / "timing.cache"
    made = {}
    for name, source, precision in (("fp32", "fp32", None), ("fp16", "fp32", "fp16"), ("int8", "int8-static", None)):
        build_engines(variants[source], root / name, precision, ShapeLimits(max_batch=64), timing_cache=cache,
                      progress=False)
        made[name] = root / name
    assert cache.stat().st_size > 0
    return made


@needs_tensorrt
@pytest.mark.parametrize("precision, floor", ENGINE_FLOORS)
def test_tensorrt_greedy_matches_pytorch(engines, precision, floor):
    assert greedy_agreement_with_pytorch(engines[precision], 300) >= floor


@needs_tensorrt
def test_tensorrt_beam_search_and_manifest(engines):
    texts = [en for en, _ in demo_numbers.held_out_pairs()[:40]]
    options = DecodeOptions(beam_size=4, batch_size=8)
    want = [t.ids for t in Translator.load(DEMO_CKPT).translate(texts, options)]
    got = [t.ids for t in Translator.load(engines["fp32"]).translate(texts, options)]
    assert np.mean([g == w for g, w in zip(got, want, strict=True)]) >= 0.975
    manifest = read_engine_manifest(engines["fp16"])
    here = current_platform()
    assert manifest["tensorrt"]["tensorrt"] == here.tensorrt and manifest["precision"] == "fp16"
    assert manifest["source"]["made_fp16_graphs"] is True


@needs_tensorrt
def test_tensorrt_refuses_swapped_or_foreign_engines(engines, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(engines["fp32"], copy)
    shutil.copyfile(engines["fp16"] / "decoder_step.plan", copy / "decoder_step.plan")
    with pytest.raises(TfmExportError, match="sha256 differs"):
        Translator.load(copy)
    shutil.copyfile(engines["fp32"] / "decoder_step.plan", copy / "decoder_step.plan")
    data = json.loads((copy / "manifest.json").read_text())
    data["tensorrt"]["tensorrt"] = "9.9.9"
    (copy / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(TfmExportError, match="rebuild them here with `tfm-export trt`"):
        Translator.load(copy)


@needs_tensorrt
def test_polygraphy_tensorrt_matches_onnxruntime(variants):
    for precision in TRT_PRECISIONS:
        assert [r for r in check_onnxruntime(variants[precision], trt=True) if r.problem] == [], precision


def test_check_refuses_a_directory_without_its_tokenizer(demo_onnx, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(demo_onnx, copy)
    (copy / "tokenizer.json").unlink()
    result = CliRunner().invoke(export_main, ["check", "--model", str(copy)])
    assert result.exit_code == 1 and "tokenizer.json: source tokenizer is missing" in result.output
