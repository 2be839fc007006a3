"""examples/web in a real headless Chromium: the page translates typed numbers exactly as tfm-run does, greedy and
with beam 4, and shows bad input as an error instead of hanging."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.common import REPO

from tfm_export.cli.run_cli import main as run_main
from tfm_export.demo import numbers as demo_numbers

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = os.environ.get("TFM_WEB_SCREENSHOT")  # where to keep the screenshot (README's: docs/web-demo.png)


@pytest.fixture(scope="module")
def web_example(tmp_path_factory) -> Path:
    """examples/web with its npm packages (from the committed lockfile) and the tokenizer it shares with Node."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium (make test installs it with apt-get "
                    "where it can)")
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node and npm are not installed")
    root = tmp_path_factory.mktemp("web")
    shutil.copytree(REPO / "examples" / "web", root / "web", ignore=shutil.ignore_patterns("node_modules"))
    (root / "node").mkdir()
    shutil.copy(REPO / "examples" / "node" / "tokenizer.js", root / "node")
    result = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=root / "web", capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return root / "web"


def tfm_run(model: Path, lines: list[str], *args: str) -> list[str]:
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model), *args], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    return result.output.split("\n")[:-1]


def test_the_page_translates_as_tfm_run_in_headless_chromium(web_example, demo_generate, tmp_path):
    lines = [en for en, _ in demo_numbers.held_out_pairs()[300:352]] + ["  Forty-Two ", "one thousand, one"]
    (tmp_path / "inputs.txt").write_text("\n".join(lines) + "\n")
    screenshot = Path(SCREENSHOT) if SCREENSHOT else tmp_path / "page.png"
    command = ["node", "check.mjs", "--model", str(demo_generate), "--inputs", str(tmp_path / "inputs.txt"),
               "--screenshot", str(screenshot), "--chromium", str(CHROMIUM)]
    result = subprocess.run(command, cwd=web_example, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    page = json.loads(result.stdout)
    assert page["loaded"].startswith("ready") and page["greedy"]["error"] == "" and page["beam"]["error"] == ""
    assert page["greedy"]["translations"] == tfm_run(demo_generate, lines)
    assert page["beam"]["translations"] == tfm_run(demo_generate, lines, "--beam-size", "4")
    assert page["beam"]["translations"] == tfm_run(demo_generate, lines, "--beam-size", "4", "--backend",
                                                   "onnxruntime-generate")
    errors = page["errors"]
    assert errors["too_long"]["error"].startswith("line 2: 402 tokens with <s> and </s>, but the model takes at most")
    assert errors["lone_surrogate"]["error"].startswith("line 2 holds a lone surrogate")
    assert errors["not_utf8"]["error"] == "latin1.txt: line 2 is not valid UTF-8; convert the file to UTF-8"
    assert screenshot.read_bytes()[:4] == b"\x89PNG"


def test_the_page_says_when_a_directory_has_no_generate_onnx(web_example, demo_onnx, tmp_path):
    (tmp_path / "inputs.txt").write_text("forty-two\n")
    result = subprocess.run(["node", "check.mjs", "--model", str(demo_onnx), "--inputs", str(tmp_path / "inputs.txt"),
                             "--chromium", str(CHROMIUM)], cwd=web_example, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1 and "has no generate.onnx" in result.stderr, result.stderr[-2000:]
