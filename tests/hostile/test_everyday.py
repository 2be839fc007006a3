"""Everyday use: streaming (a translation per line as it comes, Ctrl-C keeping what was done), file modes under a
umask, errors that name their fix, verify's verdicts, and what manifests and --version say."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from . import forge
from .commands import model_dir_ok, slow_writer_args, staging_of, wait_for
from .scratch import Case
from .support import (
    DEMO_SRC,
    DEMO_TGT,
    TINY_SENT,
    Leftover,
    MultiLineError,
    Result,
    SilentWrong,
    assert_fix_named,
    assert_ok,
    check_base,
    kill_group,
    short,
    signal_race,
)

# -- streaming --------------------------------------------------------------------------------------


def stream_proc(case: Case, *args: Any) -> subprocess.Popen:
    """tfm-run translate on the demo model, reading a pipe the case writes to, unbuffered both ways."""
    return case.popen("tfm-run", "translate", "--model", case.fx.demo(), *args, stdin=subprocess.PIPE, bufsize=0)


def line_within(p: subprocess.Popen, seconds: float) -> bytes | None:
    if not select.select([p.stdout], [], [], seconds)[0]:
        return None
    return p.stdout.readline()


def two_lines(r: Result) -> str | None:
    return None if r.out_lines == [DEMO_TGT, "sept"] else f"got {r.out_lines!r}"


def test_stream_first_line_before_eof(case: Case) -> None:
    """The first translation must come back while the writer still holds the second line."""
    p, start = stream_proc(case), time.monotonic()
    p.stdin.write(f"{DEMO_SRC}\n".encode())
    first = line_within(p, case.fx.timeout)
    if first is None:
        kill_group(p)
        case.wait(p, ["translate"], start=start)
        raise SilentWrong("no output while stdin stayed open: waited for the whole input")
    p.stdin.write(b"seven\n")
    r = case.wait(p, ["translate"], start=start)  # closes stdin: the end of the input
    r.out = first.decode() + r.out
    assert_ok(r, two_lines)


@pytest.mark.parametrize("to_file", [pytest.param(False, id="stdout"), pytest.param(True, id="partial-output")])
def test_stream_sigint_keeps(case: Case, to_file: bool) -> None:
    """Ctrl-C after two translations: stdout keeps them; --output stays as it was, they are in OUTPUT.partial."""
    out, partial = case.out("out.txt"), case.out("out.txt.partial")
    out.write_text("previous\n")
    p, start = stream_proc(case, *(["--output", out] if to_file else [])), time.monotonic()
    p.stdin.write(f"{DEMO_SRC}\nseven\n".encode())
    written: list[bytes | None] = []
    if to_file:
        def staged() -> bool:
            temps = [f for f in case.dir.iterdir() if f.name.startswith(".out.txt.")]
            return any(f.stat().st_size > 15 for f in temps if f.exists())
        wait_for(staged, p, case.fx.timeout)
    else:
        written = [line_within(p, case.fx.timeout), line_within(p, case.fx.timeout)]
    p.send_signal(signal.SIGINT)
    r = case.wait(p, ["translate"], start=start)
    check_base(r)
    if r.rc != 130 or len(r.err_lines) != 1 or not r.err_lines[0].startswith("interrupted"):
        raise SilentWrong(f"exit {r.rc}, stderr {short(' | '.join(r.err_lines))!r}", r)
    if to_file:
        kept = partial.read_text() if partial.exists() else None
        if out.read_text() != "previous\n" or kept != f"{DEMO_TGT}\nsept\n":
            raise SilentWrong(f"output {out.read_text()!r}, partial {kept!r}", r)
    elif [w.decode().strip() if w else None for w in written] != [DEMO_TGT, "sept"]:
        raise SilentWrong(f"written before the signal: {written!r}", r)


def test_stream_fifo_input(case: Case) -> None:
    """--input FIFO streams like stdin: the first translation is out before the writer sends the second line."""
    fifo = case.p("in.fifo")
    os.mkfifo(fifo)
    case.input(fifo)
    args = ["tfm-run", "translate", "--model", case.fx.demo(), "--input", fifo]
    p = case.popen(*args, bufsize=0)
    start = time.monotonic()
    with open(fifo, "wb", buffering=0) as writer:
        writer.write(f"{DEMO_SRC}\n".encode())
        first = line_within(p, case.fx.timeout)
        if first is not None:
            writer.write(b"seven\n")
    r = case.wait(p, args, start=start)
    if first is None:
        check_base(r)
        raise SilentWrong("no output before the FIFO's writer closed it", r)
    r.out = first.decode() + r.out
    assert_ok(r, two_lines)


def test_stream_error_at_line_261_with_output(case: Case) -> None:
    """A bad line far into a file: one error naming it, and --output neither written nor left partial."""
    lines = [DEMO_SRC] * 300
    lines[260] = "forty-two " * 300
    inp = case.text("in.txt", "\n".join(lines) + "\n")
    out, partial = case.out("out.txt"), case.out("out.txt.partial")
    r = case.run("tfm-run", "translate", "--model", case.fx.demo(), "--input", inp, "--output", out, "--batch-size", 4)
    assert_fix_named(r, "line 261", "--truncate")
    if out.exists() or partial.exists():
        raise SilentWrong("a failed run left an output", r)


# -- file modes -------------------------------------------------------------------------------------

MODE_CASES = [pytest.param(w, mask, replace, id=f"umask{mask:03o}-{'replaced' if replace else 'new'}/{w}")
              for w in ("translate", "random-checkpoint", "verify-report") for mask in (0o022, 0o077)
              for replace in (False, True)]


def mode_command(case: Case, writer: str, replace: bool) -> tuple[list[Any], Path]:
    """The command and the file whose mode is checked."""
    if writer == "translate":
        target = case.out("out.txt")
        return ["tfm-run", "translate", "--model", case.fx.tiny(), "--output", target, TINY_SENT], target
    if writer == "random-checkpoint":
        ck = case.out("ck")
        return (["tfm-export", "random-checkpoint", "--d-model", 8, "--heads", 1, "--layers", 1, "--ffn", 8,
                 "--vocab-size", 12, "--output", ck, *(["--force"] if replace else [])], ck / "ckpt.pt")
    rep = case.out("rep")  # verify --report: the markdown report of an int8 directory
    return (["tfm-export", "verify", "--model", case.fx.int8(), "--input", case.fx.calib(), "--beam-size", 1,
             "--min-agreement", 0, "--report", rep], rep / "precision-report.md")


@pytest.mark.parametrize("writer,mask,replace", MODE_CASES)
def test_file_mode(case: Case, writer: str, mask: int, replace: bool) -> None:
    """New files get 0666 & ~umask, replaced files keep their mode (0640 here), whatever the umask."""
    args, target = mode_command(case, writer, replace)
    if replace:
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(b"old\n")
        target.chmod(0o640)
    r = case.sh(f"umask {mask:03o}; exec {case.fx.sh_quote(args)}", timeout=2 * case.fx.timeout)
    want = 0o640 if replace else 0o666 & ~mask

    def check(r: Result) -> str | None:
        got = stat.S_IMODE(target.stat().st_mode)
        return None if got == want else f"{target.name} is {got:04o}, expected {want:04o}"
    assert_ok(r, check)


# -- errors that name their fix ---------------------------------------------------------------------

def hf_dir(case: Case) -> Path:
    """A Hugging Face model directory (a config.json marks one) given where something else is due."""
    d = case.p("hf")
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "marian"}')
    (d / "model.safetensors").write_bytes(b"weights")
    case.input(d)
    return d


def ck_dir(case: Case) -> Path:
    return case.copy_ck(case.fx.tiny_ck()).parent


FIXES: dict[str, Callable[[Case], tuple[list[Any], list[str]]]] = {  # the command, what its error must contain
    "model-is-hf-dir/translate": lambda c: (["tfm-run", "translate", "--model", hf_dir(c), "x"],
                                            ["tfm-export onnx --checkpoint", "--backend torch"]),
    "model-is-checkpoint-dir/translate": lambda c: (["tfm-run", "translate", "--model", ck_dir(c), "x"],
                                                    [str(c.p("ck", "ckpt.pt"))]),
    "model-is-checkpoint-dir-torch/translate": lambda c: (
        ["tfm-run", "translate", "--model", ck_dir(c), "--backend", "torch", "x"],
        [f"pass the checkpoint inside it, {c.p('ck', 'ckpt.pt')}"]),
    "model-is-hf-dir/inspect": lambda c: (["tfm-export", "inspect", "--model", hf_dir(c)],
                                          ["tfm-export onnx --checkpoint"]),
    "checkpoint-is-safetensors-file/onnx": lambda c: (
        ["tfm-export", "onnx", "--checkpoint", hf_dir(c) / "model.safetensors", "--output", c.out("m")],
        [f"pass the directory itself, {c.p('hf')}"]),
    "checkpoint-is-config-json/onnx": lambda c: (
        ["tfm-export", "onnx", "--checkpoint", hf_dir(c) / "config.json", "--output", c.out("m")],
        ["pass the directory itself"]),
    "checkpoint-is-checkpoint-dir/onnx": lambda c: (
        ["tfm-export", "onnx", "--checkpoint", ck_dir(c), "--output", c.out("m")],
        [f"pass the checkpoint inside it, {c.p('ck', 'ckpt.pt')}"]),
    "quantize-int8-without-calibration": lambda c: (
        ["tfm-export", "quantize", "--model", c.fx.tiny(), "--precision", "int8", "--output", c.out("q")],
        ["--calibration FILE", "--mode dynamic"]),
    "verify-fp32-without-checkpoint": lambda c: (["tfm-export", "verify", "--model", c.fx.tiny()],
                                                 ["exported from ckpt.pt", "--checkpoint PATH"]),
}


@pytest.mark.parametrize("name", FIXES)
def test_error_names_fix(case: Case, name: str) -> None:
    args, fragments = FIXES[name](case)
    assert_fix_named(case.run(*args), *fragments)


# -- Ctrl-C while PyTorch and ONNX load -------------------------------------------------------------

def test_sigint_sweep_first_2s(case: Case) -> None:
    """Ctrl-C at 20 moments of an export's first two seconds: each one line, exit 130, nothing left (an extension
    module interrupted while it initialised used to abort with a C++ dump, exit 134). Moments that met a known race
    (support.signal_race) are counted apart: they make the case an expected failure."""
    out = case.out("out")
    args = slow_writer_args(case, "onnx", out)
    races: dict[str, list[str]] = {}
    for i in range(1, 21):
        at = f"SIGINT at {0.1 * i:.1f}s"
        p = case.popen(*args)
        start = time.monotonic()
        time.sleep(0.1 * i)
        p.send_signal(signal.SIGINT)
        r = case.wait(p, args, start=start)
        race = signal_race(r, signal.SIGINT)
        if race:
            races.setdefault(race, []).append(at)
            continue
        check_base(r)
        if r.rc == 0:
            problem = model_dir_ok(out)
            if problem:
                raise SilentWrong(problem, r)
            shutil.rmtree(out)
        elif r.rc != 130 or r.err_lines != ["interrupted"]:
            raise MultiLineError(f"{at}: exit {r.rc}", r)
        left = staging_of(case.dir, "out")
        if left:
            raise Leftover(f"{left[0].name} after {at}", r)
    if races:
        pytest.xfail("; ".join(f"{', '.join(moments)}: {race}" for race, moments in races.items()))


# -- verify's verdicts ------------------------------------------------------------------------------

def test_verify_seed_export_without_vocab(case: Case) -> None:
    """A seed checkpoint carries no vocabulary; the directory exported from it does, so verify needs no --vocab."""
    ck = case.copy_ck(case.fx.seed())
    m = case.out("m")
    case.fx.run(["tfm-export", "onnx", "--checkpoint", ck, "--vocab", case.fx.seed_vocab(), "--output", m],
                cwd=case.dir)
    assert_ok(case.run("tfm-export", "verify", "--model", m, "--checkpoint", ck, "--samples", 2, "--steps", 2,
                       "--beam-size", 2, timeout=2 * case.fx.timeout))


def test_verify_wrong_graph_still_fails(case: Case) -> None:
    """A decoder step with scaled weights and its hash updated in the manifest: verify must fail it, and not as
    near-ties."""
    m = case.copy_model(case.fx.tiny(), protect=False)
    case.output(m)
    shutil.copyfile(case.fx.graphs()["decoder_step.onnx"], m / "decoder_step.onnx")
    forge.rehash(m)
    r = case.run("tfm-export", "verify", "--model", m, "--checkpoint", case.fx.tiny_ck() / "ckpt.pt", "--samples", 4,
                 "--steps", 3, "--beam-size", 2, timeout=2 * case.fx.timeout)
    assert_fix_named(r, "parity check failed", "diverging")


def test_verify_int8_names_differing_sentences(case: Case) -> None:
    """int8 verify shows the sentences whose translation differs from fp32, as many as its table counts."""
    r = case.run("tfm-export", "verify", "--model", case.fx.int8(), "--input", case.fx.calib(), "--beam-size", 1,
                 "--min-agreement", 0, timeout=2 * case.fx.timeout)

    def check(r: Result) -> str | None:
        row = next((line for line in r.out_lines if line.startswith("| greedy |")), "")
        identical, total = map(int, row.split("|")[2].split()[0].split("/")) if row else (0, 0)
        named = sum(1 for line in r.out_lines if line.startswith("  '") and " -> " in line)
        said = f"greedy: differs from fp32 on {total - identical} sentence(s):" in r.out
        if not row or (identical < total and (not said or named != min(5, total - identical))):
            return f"{identical}/{total} identical but {named} sentences named"
        return None
    assert_ok(r, check)


# -- what the tools say about themselves ------------------------------------------------------------

def test_manifest_records_no_paths(case: Case) -> None:
    """The manifest names its checkpoint by file name and sha256, never by a path of the machine that made it."""
    manifest = (case.fx.tiny() / "manifest.json").read_text()
    source = json.loads(manifest)["source_checkpoint"]
    if str(case.fx.root) in manifest or "path" in source:
        raise SilentWrong(f"manifest records {short(json.dumps(source), 80)}")
    if source.get("file") != "ckpt.pt" or source.get("sha256") != forge.sha(case.fx.tiny_ck() / "ckpt.pt"):
        raise SilentWrong(f"source_checkpoint is {short(json.dumps(source), 80)}")


@pytest.mark.parametrize("tool", ["tfm-run", "tfm-export"])
def test_version(case: Case, tool: str) -> None:
    assert_ok(case.run(tool, "--version"),
              lambda r: None if re.fullmatch(rf"{tool} \d+\.\d+\.\d+\n", r.out) else f"printed {r.out!r}")


def test_jsonl_marks_max_length_cut(case: Case) -> None:
    r = case.run("tfm-run", "translate", "--model", case.fx.demo(), "--format", "jsonl", "--max-length", 2, DEMO_SRC,
                 "seven")

    def check(r: Result) -> str | None:
        marks = [json.loads(line).get("truncated") for line in r.out_lines]
        return None if marks == [True, False] else f"truncated marks {marks!r}"
    assert_ok(r, check)
