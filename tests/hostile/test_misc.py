"""Odd arguments: --model given something that is not a model directory, calibration texts that are empty, binary
or pipes, contradictory options, and inputs given as pipes (`--input <(generate)`)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from . import forge
from .commands import model_dir_ok, writer_run
from .scratch import Case
from .support import TINY_SENT, Result, assert_expected, assert_ok_or_refused, assert_refused


def fifo(case: Case) -> Path:
    os.mkfifo(case.p("fifo"))
    return case.p("fifo")


def empty_dir(case: Case) -> Path:
    case.p("empty").mkdir()
    return case.p("empty")


def manifest_only(case: Case) -> Path:
    d = case.p("mo")
    d.mkdir()
    shutil.copyfile(case.fx.tiny() / "manifest.json", d / "manifest.json")
    return d


def engine_manifest(case: Case) -> Path:
    m = case.copy_model(case.fx.tiny())
    forge.edit_manifest(m, lambda man: man.update(format="tfm-export-engines"))
    return m


MODEL_ARGS: dict[str, Callable[[Case], Path]] = {  # what --model is given
    "checkpoint-file": lambda c: c.fx.tiny_ck() / "ckpt.pt",
    "dev-null": lambda c: Path("/dev/null"),
    "fifo": fifo,
    "missing": lambda c: c.p("nope"),
    "empty-dir": empty_dir,
    "manifest-only": manifest_only,
    "engine-manifest": engine_manifest,
    "int8-dir": lambda c: c.fx.int8(),
    "text-file-pt": lambda c: c.text("model.pt", "not a checkpoint"),
}
MODEL_ARG_CASES = [pytest.param(k, cmd, id=f"{k}/{cmd}") for k in MODEL_ARGS for cmd in ("inspect", "translate",
                                                                                        "quantize")]
MODEL_ARG_CASES += [pytest.param(k, cmd, id=f"{k}/{cmd}") for k in ("fifo", "dev-null", "engine-manifest")
                    for cmd in ("bench", "eval-demo")]


def model_command(case: Case, command: str, model: Path) -> Result:
    if command == "inspect":
        return case.run("tfm-export", "inspect", "--model", model)
    if command == "translate":
        return case.run("tfm-run", "translate", "--model", model, TINY_SENT)
    if command == "quantize":
        return case.run("tfm-export", "quantize", "--model", model, "--precision", "fp16", "--output", case.out("q"))
    if command == "bench":
        return case.run("tfm-run", "bench", "--model", model, "--backends", "ort-fp32", "--sentences", 2, "--repeats",
                        2, "--min-time", 0, "--output-length", 4, "--batch-sizes", 1, "--beam-sizes", 1, "--json",
                        case.out("b.json"))
    return case.run("tfm-export", "eval-demo", "--model", model)


@pytest.mark.parametrize("kind,command", MODEL_ARG_CASES)
def test_model_arg(case: Case, kind: str, command: str) -> None:
    r = model_command(case, command, MODEL_ARGS[kind](case))
    harmless = kind in ("checkpoint-file", "int8-dir") and command in ("translate", "inspect")
    assert_expected("either" if harmless else "error", r)


def feed_fifo(case: Case, name: str, payload: bytes, opens: int = 1) -> Path:
    """A FIFO with a thread that writes payload to each of its first `opens` readers."""
    f = case.p(name)
    os.mkfifo(f)
    case.input(f)

    def write() -> None:
        try:
            for _ in range(opens):
                with open(f, "wb") as w:
                    w.write(payload)
        except OSError:
            pass
    th = threading.Thread(target=write, daemon=True)
    th.start()
    case.threads.append(th)
    return f


def unblock_fifo(f: Path, times: int = 1) -> None:
    """Open the FIFO for reading so a writer thread the tool never served can finish."""
    for _ in range(times):
        try:
            os.close(os.open(f, os.O_RDONLY | os.O_NONBLOCK))
        except OSError:
            pass


CALIBRATIONS: dict[str, Callable[[Case], list[Any]]] = {
    "none": lambda c: [],
    "dev-null": lambda c: ["--calibration", "/dev/null"],
    "empty": lambda c: ["--calibration", c.text("c.txt", "")],
    "binary": lambda c: ["--calibration", c.text("c.bin", os.urandom(3000))],
    "blank-lines": lambda c: ["--calibration", c.text("c.txt", "\n\n\n")],
    "unknown-words": lambda c: ["--calibration", c.text("c.txt", "zzz qqq\nxxx\n")],
    "fifo-with-writer": lambda c: ["--calibration", feed_fifo(c, "c.fifo", c.fx.calib().read_bytes())],
}


@pytest.mark.parametrize("kind", CALIBRATIONS)
def test_quantize_calibration(case: Case, kind: str) -> None:
    out = case.out("q")
    extra = CALIBRATIONS[kind](case)
    r = case.run("tfm-export", "quantize", "--model", case.fx.tiny(), "--precision", "int8", *extra, "--output", out)
    if kind == "fifo-with-writer" and case.threads[-1].is_alive():
        unblock_fifo(case.p("c.fifo"))
    if kind in ("unknown-words", "fifo-with-writer"):
        assert_ok_or_refused(r, lambda r: model_dir_ok(out))
    else:
        assert_refused(r)


CONTRADICTIONS: dict[str, list[Any]] = {  # arguments; callables take the case
    "trt-fp16-and-int8": ["tfm-export", "trt", "--model", lambda c: c.fx.tiny(), "--fp16", "--int8", "--output",
                          lambda c: c.out("e")],
    "check-trt-without-gpu": ["tfm-export", "check", "--model", lambda c: c.fx.tiny(), "--trt"],
    "quantize-fp16-with-mode": ["tfm-export", "quantize", "--model", lambda c: c.fx.tiny(), "--precision", "fp16",
                                "--mode", "static", "--output", lambda c: c.out("q")],
    "quantize-int8-of-int8": ["tfm-export", "quantize", "--model", lambda c: c.fx.int8(), "--precision", "int8",
                              "--mode", "dynamic", "--output", lambda c: c.out("q")],
    "verify-int8-reference-int8": ["tfm-export", "verify", "--model", lambda c: c.fx.int8(), "--reference",
                                   lambda c: c.fx.int8(), "--input", lambda c: c.fx.calib()],
    "verify-int8-empty-input": ["tfm-export", "verify", "--model", lambda c: c.fx.int8(), "--input",
                                lambda c: c.text("e.txt", "")],
    "verify-int8-without-input": ["tfm-export", "verify", "--model", lambda c: c.fx.int8()],
    "verify-fp32-wrong-checkpoint": ["tfm-export", "verify", "--model", lambda c: c.fx.tiny(), "--checkpoint",
                                     lambda c: c.fx.demo_ck() / "ckpt.pt", "--samples", 1, "--steps", 2],
}


@pytest.mark.parametrize("kind", CONTRADICTIONS)
def test_contradictory(case: Case, kind: str) -> None:
    assert_refused(case.run(*[a(case) if callable(a) else a for a in CONTRADICTIONS[kind]]))


def test_eval_demo_on_tiny_model(case: Case) -> None:
    assert_ok_or_refused(case.run("tfm-export", "eval-demo", "--model", case.fx.tiny(), "--show-misses", 0,
                                  timeout=3 * case.fx.timeout))


@pytest.mark.parametrize("command", ["translate", "verify", "bench", "onnx", "vocab"])
def test_input_is_fifo(case: Case, command: str) -> None:
    """An input given as a pipe: read once, or refused; never a hang."""
    payload = {"translate": TINY_SENT + "\n", "verify": case.fx.calib().read_text(), "bench": TINY_SENT + "\n",
               "onnx": "", "vocab": case.fx.seed_vocab().read_text()}[command].encode()
    f = feed_fifo(case, "in.fifo", payload, opens=3)  # serve up to three opens, then stop
    if command == "translate":
        r = case.run("tfm-run", "translate", "--model", case.fx.tiny(), "--input", f)
    elif command == "verify":
        r = case.run("tfm-export", "verify", "--model", case.fx.int8(), "--input", f, "--beam-size", 1,
                     "--min-agreement", 0, timeout=2 * case.fx.timeout)
    elif command == "bench":
        r = writer_run(case, "bench-json", case.out("b.json"), ("--input", f))
    else:
        ck = f if command == "onnx" else case.fx.seed() / "ckpt.pt"
        vocab = ["--vocab", f] if command == "vocab" else []
        r = case.run("tfm-export", "onnx", "--checkpoint", ck, *vocab, "--output", case.out("out"))
    unblock_fifo(f, 3)
    case.threads[-1].join(2)
    assert_expected("error" if command == "onnx" else "either", r)
