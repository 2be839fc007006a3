"""Data loss: outputs aimed at the command's own inputs, --force on a directory of the user's, checkpoints written
over, and writes that meet a full disk."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tfm_export.runtime.prepacked_graphs import PREPACKED_DIR

from . import forge
from .commands import writer_out_names, writer_run
from .scratch import Case
from .support import TINY_SENT, InputModified, assert_ok, assert_ok_or_refused, assert_refused

# -- outputs that are inputs ------------------------------------------------------------------------

TRANSLATE_KINDS = ("input", "input-via-symlink", "input-via-dotdot", "input-via-hardlink", "input-relative",
                   "manifest", "tokenizer", "encoder", "model-dir", "checkpoint", "ckpt-tokenizer")


@pytest.mark.parametrize("kind", TRANSLATE_KINDS)
def test_translate_output_is_input(case: Case, kind: str) -> None:
    """translate --output aimed at one of its own inputs."""
    m = case.copy_model(case.fx.tiny())
    inp = case.text("in.txt", TINY_SENT + "\n")
    model: Path = m
    if kind == "input-via-hardlink":  # replacing the link (not writing through it) keeps in.txt intact
        out = case.out("hard.txt")
        os.link(inp, out)
        r = case.run("tfm-run", "translate", "--model", m, "--input", inp, "--output", out)
        assert_ok_or_refused(r, lambda r: None if inp.read_text() == TINY_SENT + "\n" else "input overwritten")
        return
    if kind in ("checkpoint", "ckpt-tokenizer"):
        model = case.copy_ck(case.fx.tiny_ck())
        out = model if kind == "checkpoint" else model.parent / "tokenizer.json"
    elif kind == "input-via-symlink":
        out = case.p("alias.txt")
        os.symlink(inp, out)
        case.input(out)
    elif kind == "input-via-dotdot":
        case.p("sub").mkdir()
        out = Path(str(case.p("sub")) + "/../in.txt")
    else:
        out = {"input": inp, "input-relative": Path("./in.txt"), "manifest": m / "manifest.json",
               "tokenizer": m / "tokenizer.json", "encoder": m / "encoder.onnx", "model-dir": m}[kind]
    assert_refused(case.run("tfm-run", "translate", "--model", model, "--input", inp, "--output", out))


DIR_OUTPUT_CASES = [pytest.param("onnx", kind, force, id=f"onnx/{kind}{'-force' if force else ''}")
                    for kind in ("checkpoint", "ckpt-dir", "ckpt-tokenizer", "parent-of-ckpt-dir", "cwd", "vocab")
                    for force in (False, True)]
DIR_OUTPUT_CASES += [pytest.param(w, kind, True, id=f"{w}/{kind}-force") for w in ("quantize", "trt")
                     for kind in ("model-dir", "manifest", "inside-model", "calibration", "parent-of-model", "cwd")]


def export_over_input(case: Case, kind: str, extra: list[str]) -> list[Any]:
    ck = case.copy_ck(case.fx.tiny_ck())
    vocab = case.text("vocab.txt", case.fx.seed_vocab().read_text())
    if kind == "vocab":
        seed = case.copy_ck(case.fx.seed(), "seed")
        return ["tfm-export", "onnx", "--checkpoint", seed, "--vocab", vocab, "--output", vocab, *extra]
    out = {"checkpoint": ck, "ckpt-dir": ck.parent, "ckpt-tokenizer": ck.parent / "tokenizer.json",
           "parent-of-ckpt-dir": case.dir, "cwd": case.dir}[kind]
    return ["tfm-export", "onnx", "--checkpoint", ck, "--output", out, *extra]


def model_writer_over_input(case: Case, writer: str, kind: str, extra: list[str]) -> list[Any]:
    m = case.copy_model(case.fx.tiny())
    calib = case.text("calib.txt", case.fx.calib().read_text())
    out = {"model-dir": m, "manifest": m / "manifest.json", "inside-model": m / "sub", "calibration": calib,
           "parent-of-model": case.dir, "cwd": case.dir}[kind]
    if writer == "quantize":
        return ["tfm-export", "quantize", "--model", m, "--precision", "int8", "--calibration", calib, "--output",
                out, *extra]
    return ["tfm-export", "trt", "--model", m, "--output", out, *extra]


@pytest.mark.parametrize("writer,kind,force", DIR_OUTPUT_CASES)
def test_output_is_input(case: Case, writer: str, kind: str, force: bool) -> None:
    extra = ["--force"] if force else []
    args = export_over_input(case, kind, extra) if writer == "onnx" else \
        model_writer_over_input(case, writer, kind, extra)
    assert_refused(case.run(*args))


REPORT_KINDS = ("bench-json-is-input", "bench-json-is-manifest", "bench-markdown-is-checkpoint",
                "bench-plot-is-tokenizer", "bench-work-dir-is-model", "bench-json-is-work-dir-file",
                "verify-report-is-model", "verify-report-is-quantized-model", "verify-report-is-input-file")


@pytest.mark.parametrize("kind", REPORT_KINDS)
def test_report_output_is_input(case: Case, kind: str) -> None:
    """bench's and verify's reports aimed at their own inputs."""
    m = case.copy_model(case.fx.tiny())
    inp = case.text("in.txt", TINY_SENT + "\n")
    if kind.startswith("verify"):
        i8 = case.copy_model(case.fx.int8(), "i8")
        reference = ["--reference", m] if kind == "verify-report-is-model" else []
        report = {"verify-report-is-model": m, "verify-report-is-quantized-model": i8,
                  "verify-report-is-input-file": inp}[kind]
        r = case.run("tfm-export", "verify", "--model", i8, *reference, "--input", inp, "--report", report,
                     "--beam-size", 1, "--min-agreement", 0, timeout=2 * case.fx.timeout)
        assert_refused(r)
        return
    model = case.copy_ck(case.fx.tiny_ck()) if kind == "bench-markdown-is-checkpoint" else m
    option = {"bench-json-is-input": ["--input", inp, "--json", inp], "bench-json-is-manifest": ["--json",
              m / "manifest.json"], "bench-markdown-is-checkpoint": ["--markdown", model],
              "bench-plot-is-tokenizer": ["--plot", m / "tokenizer.json"], "bench-work-dir-is-model": ["--work-dir", m],
              "bench-json-is-work-dir-file": ["--work-dir", m, "--json", m / "encoder.onnx"]}[kind]
    r = case.run("tfm-run", "bench", "--model", model, "--backends", "ort-fp32", "--batch-sizes", 1, "--beam-sizes",
                 1, "--sentences", 2, "--repeats", 2, "--min-time", 0, "--output-length", 4, *option,
                 timeout=2 * case.fx.timeout)
    assert_refused(r)


# -- --force on a directory of the user's -----------------------------------------------------------

USER_DIR_CASES = [pytest.param(variant, w, id=f"{variant}/{w}") for w in ("onnx", "quantize", "trt")
                  for variant in ("plain", "foreign-manifest", "broken-manifest", "manifest-dir")
                  if w != "trt" or variant in ("plain", "foreign-manifest")]


@pytest.mark.parametrize("variant,writer", USER_DIR_CASES)
def test_force_on_user_dir(case: Case, variant: str, writer: str) -> None:
    out = case.p("thesis")
    out.mkdir()
    case.decoy(out / "thesis.tex", b"\\documentclass{book} % ten years of work\n")
    case.decoy(out / "data" / "results.csv", b"a,b\n1,2\n")
    if variant == "foreign-manifest":
        case.decoy(out / "manifest.json", json.dumps({"format": "my-lab-dataset", "version": 2}).encode())
    elif variant == "broken-manifest":
        case.decoy(out / "manifest.json", b'{"format": "tfm-export-model", ')
    elif variant == "manifest-dir":
        (out / "manifest.json").mkdir()
    assert_refused(writer_run(case, writer, out, ("--force",)),
                   "replaced a directory that is not a tfm-export artifact")


# -- checkpoints written over -----------------------------------------------------------------------

OVER_CKPT_CASES = [pytest.param(w, what, id=f"{w}/{what}") for w in ("random-checkpoint", "train-demo")
                   for what in ("over-ckpt", "over-ckpt-force-control", "over-tokenizer-only", "beside-thesis")]


@pytest.mark.parametrize("writer,what", OVER_CKPT_CASES)
def test_checkpoint_writer(case: Case, writer: str, what: str) -> None:
    """random-checkpoint and train-demo over an existing checkpoint: only with --force."""
    out = case.p("trained")
    shutil.copytree(case.fx.demo_ck() if what.startswith("over-ckpt") else case.fx.tiny_ck(), out)
    if what == "over-tokenizer-only":
        (out / "ckpt.pt").unlink()
    if what == "beside-thesis":  # a directory without a checkpoint: writing beside thesis.tex is fine
        shutil.rmtree(out)
        out.mkdir()
        case.decoy(out / "thesis.tex")
    force = what == "over-ckpt-force-control"
    if force or what == "beside-thesis":
        case.output(out / "ckpt.pt", out / "tokenizer.json")
    else:
        case.input(out)
    r = writer_run(case, writer, out, ("--force",) if force else (), timeout=3 * case.fx.timeout)
    if force:
        assert_ok(r, lambda r: None if (out / "ckpt.pt").is_file() and (out / "tokenizer.json").is_file()
                  else "not written")
    elif what == "beside-thesis":
        assert_ok_or_refused(r)
    else:
        assert_refused(r, "replaced an existing checkpoint without --force")


# -- a full disk ------------------------------------------------------------------------------------

@pytest.mark.parametrize("writer", ["translate", "bench-json", "bench-markdown", "onnx", "quantize",
                                    "random-checkpoint"])
def test_disk_full(case: Case, writer: str) -> None:
    """A write that fails on a full disk leaves the previous output as it was."""
    fs = case.fx.tmpfs()
    if fs is None:
        pytest.skip("cannot mount a tmpfs here (not root?); the /dev/full output cases stand in")
    d = fs / case.dir.name
    d.mkdir()
    case.after.append(lambda: shutil.rmtree(d, ignore_errors=True))
    name, inner = writer_out_names(writer)
    out = d / name
    previous = previous_output(case, writer, out, bool(inner))
    filler = d / "filler"
    case.output(filler)
    forge.fill(filler)
    case.input(*previous)
    try:
        r = writer_run(case, writer, out, ("--force",) if inner else (), timeout=2 * case.fx.timeout)
    finally:
        filler.unlink()
    for p, data in previous.items():
        if not p.exists() or p.read_bytes() != data:
            raise InputModified(f"previous {p.name} damaged by a failed write on a full disk", r)
    assert_refused(r, "wrote to a full disk?")


def previous_output(case: Case, writer: str, out: Path, is_dir: bool) -> dict[Path, bytes]:
    """What a previous run left at `out`, written now; its content by path."""
    previous: dict[Path, bytes] = {}
    if writer in ("onnx", "quantize"):  # without its pre-packed graphs: the tmpfs is 256 KiB
        shutil.copytree(case.fx.tiny() if writer == "onnx" else case.fx.int8(), out,
                        ignore=shutil.ignore_patterns(PREPACKED_DIR))
        previous = {p: p.read_bytes() for p in out.iterdir()}
    elif is_dir:
        out.mkdir()
        previous[out / "ckpt.pt"] = b"previous checkpoint\n"
    else:
        previous[out] = b'{"previous": "valid JSON"}\n' if writer.startswith("bench") else b"previous\n"
    for p, data in previous.items():
        p.write_bytes(data)
    return previous
