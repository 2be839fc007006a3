"""The tensorrt part: the demo's fp16 engines against the CPU, where TensorRT and a GPU it supports are installed."""

from __future__ import annotations

from pathlib import Path

from .harness import SCRIPT, Environment, Part, Report, Scale
from .parity import held_out, make_demo


def tensorrt_part(report: Report, env: Environment, work: Path, scale: Scale) -> None:
    """Where TensorRT and a GPU it supports are here (not on the lent machines): the demo's fp16 engines against
    the CPU, at verify's fp16 floor; elsewhere one line saying what is missing."""
    part = Part("tensorrt", report, env, scale.budgets["tensorrt"])
    fp32 = work / "demo-fp32"
    make_demo(part, {"fp32": fp32}, ["fp32"], work, scale)
    numbers = held_out(work, scale.numbers)
    part.step("tensorrt", [SCRIPT, "tensorrt", "--model", fp32, "--output", work / "engines-fp16", "--input", numbers],
              [fp32 / "manifest.json"], timeout=300)
    part.done()
