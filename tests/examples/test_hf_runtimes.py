"""`tfm-export hf` directories in Hugging Face's own runtimes, unchanged: transformers.js in Node
(examples/transformers-js: pipeline("translation") for text, generate() for ids) and Optimum's ORTModelForSeq2SeqLM
(examples/optimum, in its own venv). The demo and a random Marian against `tfm-run translate` on the directory the
layout was made from (the Marian's rules are generate()'s); the variant presets against PyTorch's reference decoder,
differences judged as verify judges them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from support import hf_text_models
from support.common import DEMO_CKPT, REPO
from support.variant_cases import exported_case

from tfm_export.cli.run_cli import main as run_main
from tfm_export.demo import numbers as demo_numbers
from tfm_export.graphs.parity import DEFAULT_TOLERANCE
from tfm_export.hf_layout import export_hf
from tfm_export.model import reference_decoding
from tfm_export.model.loading import load_checkpoint
from tfm_export.verify.fp32 import near_tie

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


def run_js(example: Path, view: Path, lines: list[str], dtype: str = "fp32", *options: str) -> list[str]:
    result = subprocess.run(["node", "translate.mjs", str(view), "--dtype", dtype, *options], cwd=example,
                            input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.split("\n")[:-1]


def run_optimum(view: Path, lines: list[str], *options: str) -> list[str]:
    if not OPTIMUM_PYTHON.exists():
        pytest.skip(f"{OPTIMUM_PYTHON} is missing: `make optimum-env` builds Optimum's venv")
    result = subprocess.run([str(OPTIMUM_PYTHON), str(REPO / "examples" / "optimum" / "translate.py"), str(view),
                             *options], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.split("\n")[:-1]


def generated(view: Path, printed: list[str]) -> list[tuple[int, ...]]:
    """The examples' --ids lines as tfm-run reports a translation's ids: without the </s> that ended it."""
    eos = json.loads((view / "generation_config.json").read_text())["eos_token_id"]
    rows = [tuple(int(i) for i in line.split()) for line in printed]
    return [row[:-1] if row and row[-1] == eos else row for row in rows]


def tfm_run_ids(model: Path, lines: list[str], *options: str) -> list[tuple[int, ...]]:
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model), "--format", "jsonl", *options],
                                input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    return [tuple(json.loads(line)["ids"]) for line in result.output.splitlines()]


def test_transformers_js_translates_the_held_out_numbers_as_tfm_run(transformers_js, views, demo_onnx):
    lines = held_out(1000)
    assert run_js(transformers_js, views["fp32"], lines, "fp32") == tfm_run(demo_onnx, lines)


def test_transformers_js_q8_translates_as_tfm_run_on_the_int8_directory(transformers_js, views, variants):
    lines = held_out(200)
    assert run_js(transformers_js, views["int8"], lines, "q8") == tfm_run(variants["int8-dynamic"], lines)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_optimum_greedy_equals_tfm_run(views, demo_onnx, variants, precision):
    lines = held_out(100)
    got = run_optimum(views[precision], lines, "--suffix", "_quantized" if precision == "int8" else "")
    assert got == tfm_run(demo_onnx if precision == "fp32" else variants["int8-dynamic"], lines)


@pytest.fixture(scope="module")
def marian(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """(the Marian's export, its layout, source texts): the Hugging Face text tests' random Marian, whose eos is an
    ordinary token and whose outputs end at many lengths, greedy and beam."""
    hf, onnx_dir = hf_text_models.made(tmp_path_factory, "marian")
    view = tmp_path_factory.mktemp("marian") / "view"
    export_hf(onnx_dir, view, checkpoint=hf)
    return onnx_dir, view, hf_text_models.sample_texts()


@pytest.mark.parametrize("options", [(), ("--beams", "4"), ("--beams", "4", "--length-penalty", "0.6")],
                         ids=["greedy", "beam 4", "beam 4, length penalty 0.6"])
def test_optimum_decodes_a_marian_as_tfm_run(marian, options):
    onnx_dir, view, texts = marian
    ours = ["--beam-size", options[1]] if options else []
    ours += ["--length-penalty", options[3]] if len(options) > 2 else []
    assert generated(view, run_optimum(view, texts, "--ids", *options)) == tfm_run_ids(onnx_dir, texts, *ours)


def test_transformers_js_decodes_a_marian_as_tfm_run(transformers_js, marian):
    onnx_dir, view, texts = marian
    assert generated(view, run_js(transformers_js, view, texts, "fp32", "--ids")) == tfm_run_ids(onnx_dir, texts)


@pytest.mark.parametrize("preset", ["modern", "t5-like"])
def test_variant_presets_decode_as_pytorch_in_both_libraries(transformers_js, preset, tmp_path_factory):
    """Greedy against PyTorch's reference decoder: identical, or a near-tie verify would name (nothing else)."""
    ckpt_path, model_dir = exported_case(tmp_path_factory, preset)
    view = tmp_path_factory.mktemp(preset) / "view"
    export_hf(model_dir, view, checkpoint=ckpt_path)
    ckpt = load_checkpoint(ckpt_path)
    rng = np.random.default_rng(0)
    texts = [" ".join(f"w{i}" for i in rng.integers(0, 9, rng.integers(2, 9))) for _ in range(24)]
    limit = ckpt.config.n_position
    for name, printed in (("transformers.js", run_js(transformers_js, view, texts, "fp32", "--ids")),
                          ("Optimum", run_optimum(view, texts, "--ids"))):
        for text, got in zip(texts, generated(view, printed), strict=True):
            src = np.array(ckpt.vocab.source.encode(text, framed=True))
            with torch.no_grad():
                want = reference_decoding.greedy_decode(ckpt.model, torch.from_numpy(src[None]), limit)[0].tokens
            assert got == want or near_tie(ckpt, src, got, want, True, limit, DEFAULT_TOLERANCE), (name, text)
