"""examples/cpp: its tokenizer is held to Python's here; its translator runs where ONNX Runtime's C++ release is."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.common import DEMO_CKPT, REPO

from tfm_export import Translator
from tfm_export.core.tokenizer import load_tokenizer, plain_word_tokenizer
from tfm_export.demo import numbers as demo_numbers

CPP_DIR = REPO / "examples" / "cpp"


def build(tmp: Path, *cmake_args: str) -> Path:
    if not shutil.which("cmake") or not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("cmake and a C++17 compiler are needed")
    subprocess.run(["cmake", "-S", str(CPP_DIR), "-B", str(tmp), "-DCMAKE_BUILD_TYPE=Release", *cmake_args],
                   check=True, capture_output=True, timeout=300)
    subprocess.run(["cmake", "--build", str(tmp), "-j", "2"], check=True, capture_output=True, timeout=600)
    return tmp


@pytest.fixture(scope="module")
def tokenize_check(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("cpp")) / "tokenize_check"


def cpp_tokenize(binary: Path, tokenizer_json: Path, lines: list[str]) -> list[tuple[list[int], str]]:
    out = subprocess.run([str(binary), str(tokenizer_json)], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=True, timeout=60).stdout
    rows = [line.split("\t") for line in out.split("\n")[:-1]]
    return [([int(i) for i in ids.split()], text) for ids, text in rows]


def test_cpp_tokenizer_matches_python_on_the_demo_tokenizer(tokenize_check):
    path = DEMO_CKPT.parent / "tokenizer.json"
    tok = load_tokenizer(path)
    lines = [text for n in demo_numbers.held_out_numbers()[:100]
             for text in (demo_numbers.english(n), demo_numbers.french(n))]
    lines += ["", "   ", "  Forty-Two ,  ONE", "unknown words here", "quatre-vingt-dix-neuf"]
    assert cpp_tokenize(tokenize_check, path, lines) == [(tok.encode(s), tok.decode(tok.encode(s))) for s in lines]


def test_cpp_tokenizer_matches_python_on_a_plain_vocabulary(tokenize_check, tmp_path):
    tok = plain_word_tokenizer(["<unk>", "<blank>", "<s>", "</s>", "ein", "Haus", "am", "See"], "test")
    tok.save(tmp_path / "tokenizer.json")
    lines = ["ein Haus am See", "  ein   fremdes Haus ", ""]
    got = cpp_tokenize(tokenize_check, tmp_path / "tokenizer.json", lines)
    assert got == [(tok.encode(s), tok.decode(tok.encode(s))) for s in lines]


def test_cpp_translator_equals_tfm_run(demo_onnx, tmp_path):
    root = os.environ.get("ONNXRUNTIME_ROOT")
    if not root:
        pytest.skip("ONNXRUNTIME_ROOT is not set (ONNX Runtime's C++ headers are not on PyPI/npm/Debian)")
    binary = build(tmp_path / "build", f"-DONNXRUNTIME_ROOT={root}") / "tfm_translate"
    lines = [en for en, _ in demo_numbers.held_out_pairs()[:50]] + ["", "forty-two"]
    out = subprocess.run([str(binary), str(demo_onnx)], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=True, timeout=300).stdout.split("\n")[:-1]
    assert out == [r.text for r in Translator.load(demo_onnx).translate(lines)]
