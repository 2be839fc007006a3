"""Positive controls: the commands the other cases attack, on honest inputs, must succeed with the right result
(a battery whose every case refuses would otherwise prove nothing)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import pytest

from .commands import model_dir_ok
from .scratch import Case
from .support import DEMO_SRC, DEMO_TGT, TINY_SENT, Check, assert_ok, same_output


def quantize(case: Case, *options: Any) -> tuple[list[Any], Check, float]:
    q = case.out("q")
    return (["tfm-export", "quantize", "--model", case.fx.tiny(), *options, "--output", q],
            lambda r: model_dir_ok(q), 1)


def export_over_model(case: Case) -> tuple[list[Any], Check, float]:
    m = case.out("m")
    shutil.copytree(case.fx.tiny(), m)
    return (["tfm-export", "onnx", "--checkpoint", case.fx.tiny_ck() / "ckpt.pt", "--output", m, "--force"],
            lambda r: model_dir_ok(m), 1)


def export_seed(case: Case) -> tuple[list[Any], Check, float]:
    m = case.out("m")
    return (["tfm-export", "onnx", "--checkpoint", case.fx.seed() / "ckpt.pt", "--vocab", case.fx.seed_vocab(),
             "--output", m], lambda r: model_dir_ok(m), 1)


def verify_int8_report(case: Case) -> tuple[list[Any], Check, float]:
    rep = case.out("rep")
    return (["tfm-export", "verify", "--model", case.fx.int8(), "--input", case.fx.calib(), "--beam-size", 1,
             "--min-agreement", 0, "--report", rep],
            lambda r: None if (rep / "precision-report.md").is_file() else "no report", 2)


def translate_to_file(case: Case) -> tuple[list[Any], Check, float]:
    out = case.out("o.txt")
    return (["tfm-run", "translate", "--model", case.fx.demo(), DEMO_SRC, "--output", out],
            lambda r: None if out.read_text().strip() == DEMO_TGT else "wrong file content", 1)


def translate_via_link(case: Case) -> tuple[list[Any], Check, float]:
    """The whole model directory reached through a link: legitimate, must work."""
    link = case.p("model-link")
    os.symlink(case.fx.tiny(), link)
    return ["tfm-run", "translate", "--model", link, TINY_SENT], same_output(case.fx.tiny_ref()), 1


CONTROLS: dict[str, Callable[[Case], tuple[list[Any], Check | None, float]]] = {  # arguments, check, timeout factor
    "translate-tiny": lambda c: (["tfm-run", "translate", "--model", c.fx.tiny(), TINY_SENT],
                                 same_output(c.fx.tiny_ref()), 1),
    "inspect": lambda c: (["tfm-export", "inspect", "--model", c.fx.tiny()], None, 1),
    "check": lambda c: (["tfm-export", "check", "--model", c.fx.tiny()], None, 1),
    "quantize-fp16": lambda c: quantize(c, "--precision", "fp16"),
    "quantize-int8-static": lambda c: quantize(c, "--precision", "int8", "--calibration", c.fx.calib()),
    "quantize-int8-dynamic": lambda c: quantize(c, "--precision", "int8", "--mode", "dynamic"),
    "onnx-seed-checkpoint": export_seed,
    "onnx-force-replaces-model": export_over_model,
    "verify-fp32": lambda c: (["tfm-export", "verify", "--model", c.fx.tiny(), "--checkpoint",
                               c.fx.tiny_ck() / "ckpt.pt", "--samples", 2, "--steps", 3, "--beam-size", 2], None, 2),
    "verify-int8-report": verify_int8_report,
    "eval-demo": lambda c: (["tfm-export", "eval-demo", "--model", c.fx.demo(), "--show-misses", 0], None, 4),
    "translate-output-file": translate_to_file,
    "model-dir-via-symlink": translate_via_link,
}


@pytest.mark.parametrize("name", CONTROLS)
def test_control(case: Case, name: str) -> None:
    args, check, factor = CONTROLS[name](case)
    assert_ok(case.run(*args, timeout=factor * case.fx.timeout), check)
