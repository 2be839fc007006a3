"""Races, signals and leftovers: signals at several moments of a write, a kill and a rerun, two writers on one
output, a directory made while a writer runs, and standard streams closed, full or gone."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time

import pytest

from .commands import model_dir_ok, slow_writer_args, staging_of, wait_for
from .scratch import Case
from .support import (
    Leftover,
    MultiLineError,
    Result,
    SilentWrong,
    assert_interrupted,
    assert_ok,
    assert_ok_or_refused,
    assert_refused,
    check_base,
    is_clean_error,
    kill_group,
    short,
    signal_race,
)

SIGNAL_CASES = [pytest.param(cmd, sig, delay, id=f"{sig.name}-at-{delay}s/{cmd}") for cmd in ("onnx", "quantize")
                for sig in (signal.SIGINT, signal.SIGTERM) for delay in (0.2, 0.5, 1.0, 1.5, 3.0)]
SIGNAL_CASES += [pytest.param(cmd, signal.SIGHUP, 3.0, id=f"SIGHUP-at-3.0s/{cmd}") for cmd in ("onnx", "quantize")]


@pytest.mark.parametrize("command,sig,delay", SIGNAL_CASES)
def test_signal(case: Case, command: str, sig: signal.Signals, delay: float) -> None:
    """A signal mid-write: exit 130 and nothing half-made, or the work was done first."""
    out = case.out("out")
    args = slow_writer_args(case, command, out)
    p = case.popen(*args)
    start = time.monotonic()
    time.sleep(delay)
    try:
        os.kill(p.pid, sig)
    except ProcessLookupError:
        pass
    r = case.wait(p, args, start=start)
    race = signal_race(r, sig)
    if race:
        pytest.xfail(race)
    problem = model_dir_ok(out) if r.rc == 130 and out.exists() else None
    if problem:
        raise SilentWrong(f"interrupted, and {out.name} exists but is damaged: {problem}", r)
    assert_interrupted(r, lambda: model_dir_ok(out))


@pytest.mark.parametrize("command", ["onnx", "quantize"])
def test_sigkill_then_rerun(case: Case, command: str) -> None:
    """A writer killed outright leaves its staging; the next run removes it and succeeds."""
    out = case.out("out")
    args = slow_writer_args(case, command, out)
    p = case.popen(*args)
    wait_for(lambda: bool(staging_of(case.dir, "out")), p, case.fx.timeout)
    time.sleep(0.3)
    kill_group(p)
    p.communicate()
    r = case.run(*args)
    still = staging_of(case.dir, "out")
    if still:
        raise Leftover(f"stale staging {still[0].name} survived a second run", r)
    assert_ok(r, lambda r: model_dir_ok(out))


def test_live_foreign_staging_beside_output(case: Case) -> None:
    """A staging-like directory of a live process (this one) must survive a writer of the same output."""
    out = case.out("out")
    live = case.p(f".out.{os.getpid()}.abc.partial")
    live.mkdir()
    case.decoy(live / "keep.txt")
    assert_ok_or_refused(case.run(*slow_writer_args(case, "onnx", out)), lambda r: model_dir_ok(out))


@pytest.mark.parametrize("command", ["onnx", "quantize"])
def test_dir_created_during_run(case: Case, command: str) -> None:
    """The user makes the output directory while the writer stages it: no --force, so it must stay the user's."""
    out = case.out("out")
    args = slow_writer_args(case, command, out)
    p = case.popen(*args)
    start = time.monotonic()
    wait_for(lambda: bool(staging_of(case.dir, "out")), p, case.fx.timeout)
    if p.poll() is not None:
        pytest.skip("the writer finished before the directory could be created")
    out.mkdir()
    (out / "user.txt").write_bytes(b"the user's file, made while the export ran\n")
    r = case.wait(p, args, start=start)
    if not (out / "user.txt").exists():
        raise SilentWrong(f"a directory created during the run was replaced without --force (exit {r.rc})", r)
    assert_refused(r, "exit 0 but the output is the user's directory")


@pytest.mark.parametrize("command,force", [pytest.param("onnx", False, id="onnx"),
                                           pytest.param("quantize", False, id="quantize"),
                                           pytest.param("quantize", True, id="force/quantize")])
def test_two_writers_one_output(case: Case, command: str, force: bool) -> None:
    """Two writers started 0.3 s apart on one output: one complete directory; both exit 0 only with --force."""
    out = case.out("out")
    args = slow_writer_args(case, command, out) + (["--force"] if force else [])
    p1 = case.popen(*args)
    time.sleep(0.3)
    p2 = case.popen(*args)
    start = time.monotonic()
    results = [case.wait(p, args, timeout=3 * case.fx.timeout, start=start) for p in (p1, p2)]
    for r in results:
        check_base(r)
    for r in results:
        if r.rc != 0 and not is_clean_error(r):
            raise MultiLineError(short(" | ".join(r.err_lines[-2:])), r)
    problem = model_dir_ok(out)
    if problem:
        raise SilentWrong(problem)
    if not force and all(r.rc == 0 for r in results):
        raise SilentWrong("both writers exited 0 on one --output without --force")


REDIRECTIONS = [  # a shell redirection around one command: {X}/{R} tfm-export/tfm-run, {M} the model, {O} an output
    pytest.param("{R} translate --model {M} 'w1 w2' >&-", "error", id="stdout-closed/translate"),
    pytest.param("{R} translate --model {M} --format jsonl 'w1' >&-", "error", id="stdout-closed/translate-jsonl"),
    pytest.param("{X} inspect --model {M} >&-", "error", id="stdout-closed/inspect"),
    pytest.param("{X} check --model {M} >&-", "error", id="stdout-closed/check"),
    pytest.param("{R} translate --model {M} 'w1 w2' --output {O} >&-", "file", id="stdout-closed/translate-to-file"),
    pytest.param("{X} random-checkpoint --d-model 8 --heads 1 --layers 1 --ffn 8 --vocab-size 12 --output {CK} >&-",
                 "either", id="stdout-closed/random-checkpoint"),
    pytest.param("{R} translate --model {M} 'w1 w2' >/dev/full", "error", id="stdout-dev-full/translate"),
    pytest.param("{X} inspect --model {M} >/dev/full", "error", id="stdout-dev-full/inspect"),
    pytest.param("{R} translate --model {M} <&-", "error", id="stdin-closed/translate"),
    pytest.param("{R} translate --model {M} 'w1' <&-", "either", id="stdin-closed-with-text/translate"),
    pytest.param("{R} translate --model {M} </dev/null", "either", id="stdin-dev-null/translate"),
    pytest.param("{R} translate --model /nonexistent 'w1' 2>&-", "nonzero", id="stderr-closed-on-error/translate"),
    pytest.param("{R} translate --model {M} 'w1' <&- >&- 2>&-", "nonzero", id="all-closed/translate"),
]


@pytest.mark.parametrize("script,expect", REDIRECTIONS)
def test_redirection(case: Case, script: str, expect: str) -> None:
    m = case.fx.tiny()
    case.input(m)
    out = case.out("out.txt")
    if "{CK}" in script:
        case.output(case.p("ck"))
    q = shlex.quote
    r = case.sh(script.format(X=q(str(case.fx.bin / "tfm-export")), R=q(str(case.fx.bin / "tfm-run")), M=q(str(m)),
                              O=q(str(out)), CK=q(str(case.p("ck")))))
    if expect == "error":
        assert_refused(r, "output lost")
    elif expect == "nonzero":  # stderr is closed too: only the exit status can tell
        check_base(r)
        if r.rc == 0:
            raise SilentWrong("exit 0", r)
    elif expect == "file":
        assert_ok(r, lambda r: None if out.exists() and out.read_text().strip() else "--output empty")
    else:
        assert_ok_or_refused(r)


def test_stdout_reader_goes_away(case: Case) -> None:
    """A reader that leaves after one line (`| head -1`): the command ends quietly."""
    inp = case.text("in.txt", "".join(f"w{i % 30} w{(i * 7) % 30}\n" for i in range(120)))
    args = ["tfm-run", "translate", "--model", case.fx.tiny(), "--input", inp, "--batch-size", 4, "--max-length", 20]
    p = case.popen(*args)
    start = time.monotonic()
    p.stdout.readline()
    p.stdout.close()
    timed_out = False
    try:
        p.wait(timeout=case.fx.timeout)
    except subprocess.TimeoutExpired:
        kill_group(p)
        p.wait()
        timed_out = True
    r = Result([str(a) for a in args], p.returncode, "", p.stderr.read().decode("utf-8", "replace"), timed_out,
               time.monotonic() - start, case.fx.timeout)
    check_base(r)
    if r.rc != 0 and r.err_lines and not is_clean_error(r):
        raise MultiLineError(short(" | ".join(r.err_lines[-3:])), r)


@pytest.mark.parametrize("delay", [pytest.param(4.0, id="while-reading-stdin"),
                                   *[pytest.param(d, id=f"at-{d}s-stdin-open") for d in (0.5, 1.5, 2.5)]])
def test_sigint_stdin_open(case: Case, delay: float) -> None:
    """Ctrl-C while translate waits on a terminal-like stdin that never ends."""
    args = ["tfm-run", "translate", "--model", case.fx.tiny()]
    p = case.popen(*args, stdin=subprocess.PIPE)
    start = time.monotonic()
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    r = case.wait(p, args, start=start)
    race = signal_race(r, signal.SIGINT)
    if race:
        pytest.xfail(race)
    assert_interrupted(r, lambda: "exit 0 although interrupted while reading stdin")
