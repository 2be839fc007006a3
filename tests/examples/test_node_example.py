"""The exported directory works without Python: examples/node translates exactly as tfm-run does."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.common import REPO, npm_example

from tfm_export.cli.run_cli import main as run_main
from tfm_export.demo import numbers as demo_numbers

NODE_DIR = REPO / "examples" / "node"


@pytest.fixture(scope="module")
def node_example(tmp_path_factory) -> Path:
    return npm_example(tmp_path_factory, NODE_DIR)


def run_node(example: Path, model: Path, lines: list[str]) -> list[str]:
    result = subprocess.run(["node", "translate.js", str(model)], cwd=example, input="\n".join(lines) + "\n",
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\n")[:-1]


def test_node_translations_equal_tfm_run(node_example, demo_onnx):
    lines = [en for en, _ in demo_numbers.held_out_pairs()[:60]] + ["", "  Forty-Two ", "eighty", "one thousand, one"]
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--backend", "onnxruntime"],
                                input="\n".join(lines) + "\n")
    assert result.exit_code == 0
    assert run_node(node_example, demo_onnx, lines) == result.output.split("\n")[:-1]


def test_node_translates_the_external_layout_as_tfm_run(node_example, demo_external):
    """Every graph's weights in one shared file (the layout of models past 2 GB): onnxruntime-node finds them."""
    lines = [en for en, _ in demo_numbers.held_out_pairs()[:60]]
    assert run_node(node_example, demo_external, lines) == tfm_run(demo_external, lines, "--backend", "onnxruntime")


def tfm_run(model: Path, lines: list[str], *args: str) -> list[str]:
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model), *args], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    return result.output.split("\n")[:-1]


@pytest.mark.parametrize("beams", [1, 4])
def test_node_generate_equals_tfm_run(node_example, demo_generate, beams):
    """generate.js (the BeamSearch op through onnxruntime-node) against tfm-run's decoding loop, and against
    tfm-run on the same graph (which separates the op's stopping rule from the example's own plumbing)."""
    lines = [en for en, _ in demo_numbers.held_out_pairs()[:60]] + ["", "  Forty-Two ", "eighty", "one thousand, one"]
    result = subprocess.run(["node", "generate.js", str(demo_generate), "--beams", str(beams)], cwd=node_example,
                            input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    got = result.stdout.split("\n")[:-1]
    assert got == tfm_run(demo_generate, lines, "--beam-size", str(beams), "--backend", "onnxruntime-generate")
    assert got == tfm_run(demo_generate, lines, "--beam-size", str(beams))


def test_node_generate_needs_generate_onnx(node_example, demo_onnx):
    result = subprocess.run(["node", "generate.js", str(demo_onnx), "x"], cwd=node_example, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and "has no generate.onnx" in result.stderr


def test_node_refuses_a_directory_that_is_not_a_model(node_example, tmp_path):
    (tmp_path / "manifest.json").write_text('{"format": "something-else"}')
    result = subprocess.run(["node", "translate.js", str(tmp_path), "x"], cwd=node_example, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and "not a tfm-export model directory" in result.stderr


def test_node_says_it_runs_float32_tensors_when_given_an_fp16_directory(node_example, demo_onnx, tmp_path):
    from tfm_export.precision.pipeline import quantize_model_dir
    quantize_model_dir(demo_onnx, tmp_path / "fp16", "fp16", progress=False)
    result = subprocess.run(["node", "translate.js", str(tmp_path / "fp16"), "forty-two"], cwd=node_example,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (f"error: {tmp_path / 'fp16'}: past_key_values.0.decoder.key is float16 (a fp16 "
                             "directory); this example runs float32 tensors: give it the fp32 or int8 directory, or "
                             "one quantized with --keep-io-types\n")


def test_contract_doc_names_every_graph_tensor():
    """docs/graph-contract.md stays in step with the graph specs the exporter uses."""
    from tfm_export.core.config import ModelConfig
    from tfm_export.core.graph_spec import all_specs
    doc = (REPO / "docs" / "graph-contract.md").read_text()
    config = ModelConfig(src_vocab_size=10, trg_vocab_size=10, n_layers=1)
    for spec in all_specs(config).values():
        assert f"## {spec.graph.filename}" in doc
        for tensor in (*spec.inputs, *spec.outputs):
            assert f"`{tensor.name.replace('.0.', '.{i}.')}" in doc, tensor.name
            assert all(axis in doc for axis in tensor.shape if isinstance(axis, str))
