"""`tfm-export hf` directories in Hugging Face's own runtimes, unchanged: transformers.js's pipeline("translation")
in Node (examples/transformers-js) and Optimum's ORTModelForSeq2SeqLM (examples/optimum, in its own venv), each
against `tfm-run translate` on the directory the layout was made from."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.common import DEMO_CKPT, REPO

from tfm_export.cli.run_cli import main as run_main
from tfm_export.demo import numbers as demo_numbers
from tfm_export.hf_layout import export_hf

JS_DIR = REPO / "examples" / "transformers-js"
OPTIMUM_PYTHON = REPO / ".venv-optimum" / "bin" / "python"


@pytest.fixture(scope="module")
def transformers_js(tmp_path_factory) -> Path:
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node and npm are not installed")
    work = tmp_path_factory.mktemp("transformers-js") / "example"
    shutil.copytree(JS_DIR, work, ignore=shutil.ignore_patterns("node_modules"))
    result = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=work, capture_output=True, text=True,
                            timeout=600, env={**os.environ, "ONNXRUNTIME_NODE_INSTALL_CUDA": "skip"})
    assert result.returncode == 0, result.stderr[-2000:]
    return work


@pytest.fixture(scope="module")
def views(demo_onnx, variants, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("views")
    export_hf(demo_onnx, root / "fp32", checkpoint=DEMO_CKPT)
    export_hf(variants["int8-dynamic"], root / "int8")
    return {"fp32": root / "fp32", "int8": root / "int8"}


def held_out(count: int) -> list[str]:
    return [en for en, _ in demo_numbers.held_out_pairs()[:count]]


def tfm_run(model: Path, lines: list[str]) -> list[str]:
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model)], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    return result.output.split("\n")[:-1]


def run_js(example: Path, view: Path, lines: list[str], dtype: str) -> list[str]:
    result = subprocess.run(["node", "translate.mjs", str(view), "--dtype", dtype], cwd=example,
                            input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.split("\n")[:-1]


def test_transformers_js_translates_the_held_out_numbers_as_tfm_run(transformers_js, views, demo_onnx):
    lines = held_out(1000)
    assert run_js(transformers_js, views["fp32"], lines, "fp32") == tfm_run(demo_onnx, lines)


def test_transformers_js_q8_translates_as_tfm_run_on_the_int8_directory(transformers_js, views, variants):
    lines = held_out(200)
    assert run_js(transformers_js, views["int8"], lines, "q8") == tfm_run(variants["int8-dynamic"], lines)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_optimum_greedy_equals_tfm_run(views, demo_onnx, variants, precision):
    if not OPTIMUM_PYTHON.exists():
        pytest.skip(f"{OPTIMUM_PYTHON} is missing: `make optimum-env` builds Optimum's venv")
    lines = held_out(100)
    suffix = "_quantized" if precision == "int8" else ""
    result = subprocess.run([str(OPTIMUM_PYTHON), str(REPO / "examples" / "optimum" / "translate.py"),
                             str(views[precision]), "--suffix", suffix], input="\n".join(lines) + "\n",
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    source = demo_onnx if precision == "fp32" else variants["int8-dynamic"]
    assert result.stdout.split("\n")[:-1] == tfm_run(source, lines)
