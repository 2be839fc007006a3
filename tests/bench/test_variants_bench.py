"""`tfm-run bench`, `tfm-run translate` and `tfm-export verify` take any variant; CTranslate2 stays the anchor
where its spec expresses the variant and says why where it does not."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from support.variant_cases import case_config, exported_case, save_varied_checkpoint

from tfm_export.bench.artifacts import Built, build_variants, open_model
from tfm_export.bench.runners import Artifacts, unavailable
from tfm_export.cli.export_cli import main as export_main
from tfm_export.cli.run_cli import main as run_main
from tfm_export.model.synthetic import random_texts
from tfm_export.trt.compat import check_model_dir

pytest.importorskip("ctranslate2", reason="CTranslate2 is in the dev/bench extras")


@pytest.mark.slow  # minutes of exports; make test holds the parts: the tiny bench run with its CTranslate2 anchor
# (test_bench) and CTranslate2 scoring the modern model as PyTorch does (test_variants_model)
def test_bench_runs_a_modern_model_with_ctranslate2_as_the_anchor(tmp_path):
    ckpt = save_varied_checkpoint(case_config("modern", n_position=16), tmp_path / "m")
    result = CliRunner().invoke(run_main, [
        "bench", "--model", str(ckpt), "--backends", "torch-cache,ort-fp32,ct2-fp32", "--batch-sizes",
        "1,3", "--beam-sizes", "1,2", "--output-length", "5", "--sentences", "6", "--repeats", "2", "--min-time", "0",
        "--threads", "1", "--json", str(tmp_path / "b.json")])
    assert result.exit_code == 0, result.output
    backends = json.loads((tmp_path / "b.json").read_text())["backends"]
    for name in ("torch-cache", "ct2-fp32"):
        assert not backends[name]["skipped"] and backends[name]["agreement"] == 1.0, name


def test_bench_says_why_ctranslate2_cannot_run_deepnorm(tmp_path):
    ckpt = save_varied_checkpoint(case_config("deepnorm + swish"), tmp_path / "m")
    model = open_model(ckpt)
    built = Built(Artifacts(ckpt, {"fp32": tmp_path / "unused"}, None))
    build_variants(built, model, tmp_path, None, ("ct2-fp32", "ct2-int8"), 1)
    assert not (tmp_path / "ctranslate2").exists()
    assert unavailable("ct2-fp32", built.artifacts) == "CTranslate2's spec cannot express DeepNorm (no residual " \
                                                      "scale alpha)"


def test_verify_translate_and_inspect_take_a_variant_directory(tmp_path_factory, tmp_path):
    """The t5-like combination's export, which test_variants_export reads too (made once per run)."""
    ckpt, model = exported_case(tmp_path_factory, "t5-like")
    (tmp_path / "in.txt").write_text("\n".join(random_texts(case_config("t5-like"), 6, 2, 8)) + "\n")
    verified = CliRunner().invoke(export_main, ["verify", "--model", str(model), "--checkpoint", str(ckpt), "--input",
                                                str(tmp_path / "in.txt"), "--samples", "4"])
    assert verified.exit_code == 0, verified.output
    inspected = CliRunner().invoke(export_main, ["inspect", "--model", str(model)])
    assert "architecture: norm=rmsnorm, placement=pre, embedding_norm=False, activation=geglu" in inspected.output
    ops = "(Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul)"  # 2 layers' sublayers and the final norm, per graph
    assert f"RMSNorm as primitive ops: 5 x {ops}" in inspected.output and f"7 x {ops}" in inspected.output
    assert "relative bias as primitive ops" in inspected.output
    outputs = [CliRunner().invoke(run_main, ["translate", "--model", str(path), "--input", str(tmp_path / "in.txt"),
                                             "--beam-size", "2"]).output for path in (model, ckpt)]
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 6


@pytest.mark.slow
def test_opset_18_takes_a_variant_directory(tmp_path):
    """RMSNorm's ReduceMean takes its axes as an input from opset 18, which TensorRT 8.6's parser does not read."""
    ckpt = save_varied_checkpoint(case_config("t5-like", n_position=24), tmp_path / "m")
    model = tmp_path / "onnx"
    exported = CliRunner().invoke(export_main, ["onnx", "--checkpoint", str(ckpt), "--output", str(model), "--opset",
                                                "18"])
    assert exported.exit_code == 0, exported.output
    errors = [f"{f.release}: {f.message}" for f in check_model_dir(model).errors()]  # ReduceMean's axes as input
    assert errors and all(e.startswith("TensorRT 8.6: opset 18 is outside") for e in errors)
    (tmp_path / "in.txt").write_text("\n".join(random_texts(case_config("t5-like"), 6, 2, 8)) + "\n")
    verified = CliRunner().invoke(export_main, ["verify", "--model", str(model), "--checkpoint", str(ckpt), "--input",
                                                str(tmp_path / "in.txt"), "--samples", "4"])
    assert verified.exit_code == 0, verified.output
