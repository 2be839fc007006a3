"""The shipped demo model: small, self-contained, and as accurate as docs/quickstart.md says."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.common import DEMO_CKPT, REPO

from tfm_export import DecodeOptions, Translator
from tfm_export.cli.export_cli import main as export_main
from tfm_export.demo import numbers as demo_numbers
from tfm_export.model.loading import load_checkpoint


@pytest.fixture(scope="module")
def demo():
    return load_checkpoint(DEMO_CKPT)


@pytest.fixture(scope="module", params=["torch", "onnxruntime"])
def translator(request, demo_onnx):
    return Translator.load(DEMO_CKPT if request.param == "torch" else demo_onnx)


def test_demo_checkpoint_is_small_and_finds_its_tokenizer(demo):
    assert DEMO_CKPT.stat().st_size <= 25 * 1024 * 1024
    assert demo.kind == "tfm-export" and demo.vocab.shared
    assert demo.vocab.source.origin == str(DEMO_CKPT.parent / "tokenizer.json")


def test_held_out_numbers_are_never_trained_on():
    import random
    held_out = set(demo_numbers.held_out_numbers())
    rng = random.Random(0)
    assert len(held_out) == 1000
    assert not held_out & {demo_numbers.training_number(rng) for _ in range(20000)}


@pytest.mark.parametrize("beam_size", [1, 4])
def test_exact_match_on_held_out_numbers(translator, beam_size):
    pairs = demo_numbers.held_out_pairs()
    results = translator.translate([en for en, _ in pairs], DecodeOptions(beam_size=beam_size, batch_size=100))
    score, _ = demo_numbers.exact_match([r.text for r in results], [fr for _, fr in pairs])
    assert score >= 0.995  # docs/quickstart.md: 996/1000 both ways; at most one more miss than measured


def test_eval_demo_command_reports_exact_match():
    result = CliRunner().invoke(export_main, ["eval-demo", "--model", str(DEMO_CKPT), "--show-misses", "0"])
    assert result.exit_code == 0
    assert result.output.startswith("exact match: ") and "/1000) held-out numbers, greedy" in result.output
    assert int(result.output.split("(")[1].split("/")[0]) >= 995


def test_console_script_translates_forty_two():
    script = Path(sys.executable).parent / "tfm-run"
    if not script.exists():
        script = shutil.which("tfm-run")
    if script is None:
        pytest.skip("tfm-run is not installed in this environment (run through `make test`)")
    out = subprocess.run([str(script), "translate", "--model", str(DEMO_CKPT), "--backend", "torch",
                          "forty-two", "seventy-one", "eighty"], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["quarante-deux", "soixante et onze", "quatre-vingts"]


def test_make_demo_sentences_translate_correctly(translator):
    """The sentences `make demo` shows, across magnitudes, must come out exactly right."""
    numbers = [42, 71, 80, 1234, 7001, 12345, 999999]
    results = translator.translate([demo_numbers.english(n) for n in numbers])
    assert [r.text for r in results] == [demo_numbers.french(n) for n in numbers]


def test_make_demo_ends_with_one_verdict_of_its_four_checks(demo_onnx, tmp_path):
    """scripts/demo_verdict.py reads the summaries the real commands print (here on the demo directory and an
    int8 one, with fewer samples than make demo takes), and make demo ends with it."""
    from tfm_export.precision.pipeline import quantize_model_dir
    quantize_model_dir(demo_onnx, tmp_path / "int8", "int8", "dynamic", progress=False)
    samples = str(REPO / "models" / "demo" / "samples.en.txt")
    runs = {"parity": ["verify", "--model", str(demo_onnx), "--checkpoint", str(DEMO_CKPT), "--samples", "2",
                       "--steps", "2", "--beam-size", "1"],
            "exact match": ["eval-demo", "--model", str(demo_onnx), "--show-misses", "0"],
            "int8": ["verify", "--model", str(tmp_path / "int8"), "--input", samples, "--beam-size", "1"],
            "check": ["check", "--model", str(demo_onnx)]}
    outputs = {}
    for check, args in runs.items():
        result = CliRunner().invoke(export_main, args)
        assert result.exit_code == 0, result.output
        outputs[check] = result.output
    verdict = [sys.executable, str(REPO / "scripts" / "demo_verdict.py"), str(tmp_path / "demo.log")]
    (tmp_path / "demo.log").write_text("".join(outputs.values()))
    passed = subprocess.run(verdict, capture_output=True, text=True)
    assert passed.returncode == 0 and passed.stdout.count("\n") == 1
    assert passed.stdout.startswith("demo: PASSED: parity OK (") and "; exact match: 99." in passed.stdout
    assert "; int8 OK against fp32 (" in passed.stdout and passed.stdout.endswith("; check OK\n")
    (tmp_path / "demo.log").write_text(outputs["parity"] + outputs["exact match"] + outputs["check"])
    failed = subprocess.run(verdict, capture_output=True, text=True)
    assert failed.returncode == 1 and failed.stdout.startswith("demo: FAILED: no int8 summary")
    recipe = (REPO / "Makefile").read_text().split("\ndemo: setup\n")[1].split("\n\n")[0]
    assert recipe.splitlines()[-1].endswith("scripts/demo_verdict.py $(DEMO_LOG)")
    assert recipe.count("| tee -a $(DEMO_LOG)") == 4
