"""The commands as the cases run them, with cheap settings: the readers of a model directory, the writers of an
output, the slow writers that leave room for a signal, and checks of what they wrote."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import forge
from .scratch import Case
from .support import DEMO_SRC, TINY_SENT, Result

READERS = ("translate", "inspect", "check", "quantize", "verify", "bench", "trt", "eval-demo")
WRITERS = ("onnx", "quantize", "random-checkpoint", "translate", "bench-json", "bench-markdown", "verify-report",
           "train-demo")
BENCH_CHEAP = ("--backends", "ort-fp32", "--batch-sizes", 1, "--beam-sizes", 1, "--sentences", 2, "--repeats", 2,
               "--min-time", 0, "--output-length", 4)


def reader_run(case: Case, reader: str, m: Path, timeout: float | None = None) -> Result:
    """Run one reader of a model directory."""
    t = case.fx.timeout
    if reader == "translate":
        return case.run("tfm-run", "translate", "--model", m, TINY_SENT, timeout=timeout)
    if reader in ("inspect", "check"):
        return case.run("tfm-export", reader, "--model", m, timeout=timeout)
    if reader == "quantize":
        return case.run("tfm-export", "quantize", "--model", m, "--precision", "fp16", "--output", case.out("q-out"),
                        timeout=timeout)
    if reader == "verify":
        return case.run("tfm-export", "verify", "--model", m, "--checkpoint", case.fx.tiny_ck() / "ckpt.pt",
                        "--samples", 1, "--steps", 2, "--beam-size", 1, timeout=timeout)
    if reader == "bench":
        case.output(case.p("bench-work"))
        return case.run("tfm-run", "bench", "--model", m, *BENCH_CHEAP, "--json", case.out("bench.json"),
                        timeout=timeout or 2 * t)
    if reader == "trt":
        return case.run("tfm-export", "trt", "--model", m, "--output", case.out("engines"), timeout=timeout)
    if reader == "eval-demo":
        return case.run("tfm-export", "eval-demo", "--model", m, "--show-misses", 0, timeout=timeout or 3 * t)
    raise ValueError(reader)


def writer_run(case: Case, writer: str, out: Path | str, extra: tuple = (), timeout: float | None = None) -> Result:
    """Run one writer with `out` as its output."""
    fx, t = case.fx, case.fx.timeout
    if writer == "onnx":
        return case.run("tfm-export", "onnx", "--checkpoint", fx.tiny_ck() / "ckpt.pt", "--output", out, *extra,
                        timeout=timeout)
    if writer == "quantize":
        return case.run("tfm-export", "quantize", "--model", fx.tiny(), "--precision", "int8", "--mode", "dynamic",
                        "--output", out, *extra, timeout=timeout)
    if writer == "random-checkpoint":
        return case.run("tfm-export", "random-checkpoint", "--d-model", 8, "--heads", 1, "--layers", 1, "--ffn", 8,
                        "--vocab-size", 12, "--output", out, *extra, timeout=timeout)
    if writer == "train-demo":
        return case.run("tfm-export", "train-demo", "--steps", 1, "--batch-size", 2, "--threads", 1, "--output", out,
                        *extra, timeout=timeout)
    if writer == "translate":
        return case.run("tfm-run", "translate", "--model", fx.tiny(), TINY_SENT, "--output", out, *extra,
                        timeout=timeout)
    if writer in ("bench-json", "bench-markdown", "bench-plot"):
        return case.run("tfm-run", "bench", "--model", fx.tiny(), *BENCH_CHEAP, "--" + writer.split("-")[1], out,
                        *extra, timeout=timeout or 2 * t)
    if writer == "trt":
        return case.run("tfm-export", "trt", "--model", fx.tiny(), "--output", out, *extra, timeout=timeout)
    if writer == "verify-report":
        return case.run("tfm-export", "verify", "--model", fx.int8(), "--input", fx.calib(), "--report", out,
                        "--beam-size", 1, "--min-agreement", 0, *extra, timeout=timeout or 2 * t)
    raise ValueError(writer)


def writer_out_names(writer: str) -> tuple[str, list[str]]:
    """The output's name, and the names written inside it (for directory outputs)."""
    return {
        "onnx": ("model", ["manifest.json", "encoder.onnx", "tokenizer.json"]),
        "quantize": ("q", ["manifest.json", "encoder.onnx"]),
        "random-checkpoint": ("ck", ["ckpt.pt", "tokenizer.json"]),
        "train-demo": ("demo", ["ckpt.pt", "tokenizer.json"]),
        "translate": ("out.txt", []),
        "bench-json": ("bench.json", []),
        "bench-markdown": ("bench.md", []),
        "verify-report": ("report", ["precision-report.md"]),
    }[writer]


def slow_writer_args(case: Case, command: str, out: Path) -> list[Any]:
    """An export or a calibrated quantize: seconds of work, room for a signal."""
    if command == "onnx":
        return ["tfm-export", "onnx", "--checkpoint", case.fx.tiny_ck() / "ckpt.pt", "--output", out]
    return ["tfm-export", "quantize", "--model", case.fx.tiny(), "--precision", "int8", "--calibration",
            case.fx.calib_big(), "--output", out]


def staging_of(folder: Path, name: str) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith(".partial")]


def wait_for(cond: Callable[[], bool], p: subprocess.Popen, limit: float) -> bool:
    """Poll cond until it holds, the process exits, or the limit passes."""
    end = time.monotonic() + limit
    while time.monotonic() < end and p.poll() is None:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def model_dir_ok(d: Path) -> str | None:
    """A finished model directory: manifest readable and every graph and file it lists present with its hash."""
    try:
        m = forge.load_manifest(d)
        for entry in m["graphs"].values():
            if forge.sha(d / entry["file"]) != entry["sha256"]:
                return f"{entry['file']} does not match the manifest"
        for name, h in m.get("files", {}).items():
            if forge.sha(d / name) != h:
                return f"{name} does not match the manifest"
    except Exception as exc:
        return f"output model directory damaged: {exc!r}"
    return None


def checkpoint_run(case: Case, command: str, ck: Path, *extra: Any, mem_gb: float | None = None) -> Result:
    """One command given a checkpoint: export it, translate with it (PyTorch), eval-demo it, or verify the clean
    tiny model against it."""
    if command == "onnx":
        return case.run("tfm-export", "onnx", "--checkpoint", ck, *extra, "--output", case.out("out"), mem_gb=mem_gb)
    if command in ("translate", "translate-demo"):
        text = DEMO_SRC if command == "translate-demo" else TINY_SENT
        return case.run("tfm-run", "translate", "--model", ck, *extra, text, mem_gb=mem_gb)
    if command == "eval-demo":
        return case.run("tfm-export", "eval-demo", "--checkpoint", ck, "--show-misses", 0,
                        timeout=3 * case.fx.timeout)
    if command == "verify":
        m = case.copy_model(case.fx.tiny())
        return case.run("tfm-export", "verify", "--model", m, "--checkpoint", ck, *extra, "--samples", 1, "--steps", 2,
                        "--beam-size", 1, mem_gb=mem_gb)
    raise ValueError(command)
