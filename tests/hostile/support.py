"""The battery's machinery: the installed commands run as a user's shell runs them, their outcome judged, and the
scratch tree watched so that any file written or changed outside a case's named outputs is a finding.

Every case ends fine (`ok`: exit 0, the result checked where an oracle is cheap; `clean-error`: a non-zero exit
with one stderr line starting "Error:" or "interrupted"), skips (the machine cannot set it up), or fails with one
of the findings below, raised as an AssertionError subclass named after it."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Seconds a command may run before it counts as a hang (slow cases allow a multiple); HOSTILE_TIMEOUT changes it.
# A tiny model's export takes ~10 s on a quiet 2-core machine, and 90-120 s when other jobs load it to ~10.
TIMEOUT = float(os.environ.get("HOSTILE_TIMEOUT", "300"))
TOOLS = ("tfm-export", "tfm-run")
# progress output, not part of an error: bench's log lines and a progress bar's last redraw (tqdm)
PROGRESS_RE = re.compile(r"^\[(bench|progress)\] |^(?!Error:)[^|]*\d+%\|[^|]*\| *\d+/\d+ ")
LEFTOVER_RE = re.compile(r"^\..*(\.partial|\.tmp|\.old[.-].*|\.old)$")
DEMO_SRC, DEMO_TGT = "forty-two", "quarante-deux"
TINY_SENT = "w1 w2 w3"
DEVICES = ("/dev/null", "/dev/full")
_SHOWN_ROOT = ["\0"]  # the scratch directory, shown as $T in messages (show_as_t)


def show_as_t(root: Path) -> None:
    _SHOWN_ROOT[0] = str(root)


def short(text: str, n: int = 110) -> str:
    """One line of at most n characters, the scratch directory shown as $T."""
    text = " ".join(text.replace(_SHOWN_ROOT[0], "$T").split())
    return text if len(text) <= n else text[: n - 3] + "..."


# --------------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------------

@dataclass
class Result:
    argv: list[str]
    rc: int | None
    out: str
    err: str
    timed_out: bool
    seconds: float
    timeout: float

    @property
    def err_lines(self) -> list[str]:
        """stderr without blank lines and progress output (bars redraw with carriage returns)."""
        lines = (line.split("\r")[-1].strip() for line in self.err.split("\n"))
        return [line for line in lines if line and not PROGRESS_RE.match(line)]

    @property
    def out_lines(self) -> list[str]:
        return self.out.splitlines()

    def describe(self) -> str:
        """The command and the end of what it said, for a failure message."""
        return (f"\n  $ {short(shlex.join(self.argv), 400)}\n  exit {self.rc} after {self.seconds:.1f}s; stderr: "
                f"{short(' | '.join(self.err_lines[-4:]), 400) or '(none)'}")


Check = Callable[[Result], "str | None"]  # None when the result is right, else what is wrong


def child_setup(gb: float | None = None) -> Callable[[], None]:
    """Run in each child before exec: SIGINT back to its default (a run started in the background with `&` has it
    ignored, and children inherit that, so Ctrl-C cases would test nothing), and optionally a cap on the address
    space, for cases that could make a careless tool allocate tens of GB on a shared machine."""
    def setup() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if gb:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (int(gb * (1 << 30)),) * 2)
    return setup


def finish(p: subprocess.Popen, argv: list[str], timeout: float, start: float, input: bytes | None = None
           ) -> Result:
    """Wait for a started command (its whole process group killed at the timeout) and collect what it printed."""
    timed_out = False
    try:
        out, err = p.communicate(input, timeout=max(1.0, timeout - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(p)
        out, err = p.communicate()
    return Result(argv, p.returncode, (out or b"").decode("utf-8", "replace"),
                  (err or b"").decode("utf-8", "replace"), timed_out, time.monotonic() - start, timeout)


def kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def tool_dir(scratch: Path) -> Path:
    """The commands installed beside the interpreter that runs pytest (so `make hostile` tests the checkout it runs
    from); without them, wrappers that call the same entry points with that interpreter."""
    here = Path(sys.executable).parent
    if all((here / tool).exists() for tool in TOOLS):
        return here
    wrappers = scratch / "bin"
    wrappers.mkdir(exist_ok=True)
    for tool, main in zip(TOOLS, ("export_main", "run_main"), strict=True):
        code = f"import sys; sys.argv[0] = {tool!r}; from tfm_export.cli.entry import {main}; sys.exit({main}())"
        (wrappers / tool).write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(code)} "$@"\n')
        (wrappers / tool).chmod(0o755)
    return wrappers


# --------------------------------------------------------------------------------------------------
# verdicts
# --------------------------------------------------------------------------------------------------

class Finding(AssertionError):
    """A verdict that is a finding; each subclass is one of the battery's verdicts."""
    verdict = "finding"

    def __init__(self, reason: str, result: Result | None = None) -> None:
        self.reason = reason
        super().__init__(f"{self.verdict}: {reason}" + (result.describe() if result else ""))


class WroteOutside(Finding):
    """A file appeared or changed outside the case's named outputs (a decoy, a device, a planted link's target)."""
    verdict = "wrote-outside"


class InputModified(Finding):
    """An input of the command changed."""
    verdict = "input-modified"


class SilentWrong(Finding):
    """Exit 0 where a refusal was due, or a wrong result."""
    verdict = "silent-wrong"


class Crash(Finding):
    """Killed by a signal."""
    verdict = "crash"


class Hang(Finding):
    """No exit within the timeout."""
    verdict = "hang"


class Traceback(Finding):
    """A Python traceback on stderr."""
    verdict = "traceback"


class Leftover(Finding):
    """A staging or temporary file left behind."""
    verdict = "leftover"


class MultiLineError(Finding):
    """A failure that is not one "Error:" line."""
    verdict = "multi-line-error"


class Refused(Finding):
    """A valid request failed."""
    verdict = "refused"


class NoFixNamed(Finding):
    """A one-line error that does not say what to do, where the case knows the fix."""
    verdict = "no-fix-named"


ORDER: tuple[type[Finding], ...] = (WroteOutside, InputModified, SilentWrong, Crash, Hang, Traceback, Leftover,
                                    MultiLineError, Refused, NoFixNamed)


def check_base(r: Result) -> None:
    """hang / crash / traceback, whatever the case expected."""
    __tracebackhide__ = True
    if r.timed_out:
        raise Hang(f"no exit within {r.timeout:.0f}s", r)
    if r.rc is not None and r.rc < 0:
        try:
            name = signal.Signals(-r.rc).name
        except ValueError:
            name = str(-r.rc)
        raise Crash(f"killed by {name}", r)
    if "Traceback" in r.err:
        raise Traceback((r.err_lines[-1] if r.err_lines else "Traceback")[:160], r)


def is_clean_error(r: Result) -> bool:
    lines = r.err_lines
    return r.rc not in (0, None) and len(lines) == 1 and lines[0].startswith(("Error:", "interrupted"))


def assert_refused(r: Result, why: str = "") -> str:
    """The command must refuse, in one clean line (returned)."""
    __tracebackhide__ = True
    check_base(r)
    if r.rc == 0:
        raise SilentWrong(f"accepted (exit 0){': ' + why if why else ''}; out={short(r.out, 60)!r}", r)
    if not is_clean_error(r):
        raise MultiLineError(f"exit {r.rc}, {len(r.err_lines)} stderr lines", r)
    return r.err_lines[0]


def assert_fix_named(r: Result, *fragments: str) -> str:
    """The command must refuse in one clean line that contains every fragment (the fix)."""
    __tracebackhide__ = True
    line = assert_refused(r)
    missing = [f for f in fragments if f not in line]
    if missing:
        raise NoFixNamed(f"lacks {missing[0]!r}: {short(line)}", r)
    return line


def assert_ok(r: Result, check: Check | None = None) -> str:
    """The command must succeed, and check(r) must find nothing wrong."""
    __tracebackhide__ = True
    check_base(r)
    if r.rc != 0:
        if is_clean_error(r):
            raise Refused(f"valid request refused: {short(r.err_lines[0])}", r)
        raise MultiLineError(f"exit {r.rc}", r)
    problem = check(r) if check else None
    if problem:
        raise SilentWrong(problem, r)
    return "ok"


def assert_ok_or_refused(r: Result, check: Check | None = None) -> str:
    """A clean refusal, or success with a right result: "ok" or "clean-error"."""
    __tracebackhide__ = True
    check_base(r)
    if r.rc == 0:
        return assert_ok(r, check)
    assert_refused(r)
    return "clean-error"


def assert_interrupted(r: Result, check_done: Callable[[], str | None]) -> str:
    """After a signal: exit 130 and "interrupted", or (the signal came after the work) exit 0 with a full output."""
    __tracebackhide__ = True
    check_base(r)
    if r.rc == 0:
        problem = check_done()
        if problem:
            raise SilentWrong(problem, r)
        return "ok"
    if r.rc == 130 and is_clean_error(r):
        return "clean-error"
    if is_clean_error(r):
        raise SilentWrong(f"signal ignored, the command went on (exit {r.rc})", r)
    raise MultiLineError(f"exit {r.rc}, {len(r.err_lines)} lines", r)


def assert_expected(expect: str, r: Result, check: Check | None = None) -> str:
    """expect "error": assert_refused; "either": assert_ok_or_refused; "ok": assert_ok."""
    __tracebackhide__ = True
    if expect == "error":
        return assert_refused(r)
    return assert_ok_or_refused(r, check) if expect == "either" else assert_ok(r, check)


# Known findings of the signal cases: races in a command's first moments that a busy machine widens. Before the
# entry point (tfm_export.cli.entry._run) has installed the handlers, during Python's start-up and the import of the
# entry module (~0.1 s on a busy 2-core machine), a signal meets Python's defaults. And now and then (1 in 60 to 120
# Ctrl-C sent 0.25-0.9 s after the start of an export, on a busy machine) a KeyboardInterrupt escapes tfm-export's
# own handlers and reaches click's main, which prints "Aborted!" and exits 1.
BEFORE_HANDLERS = ("known finding: the signal arrived before the entry point installed its handlers (Python's "
                   "start-up and the import of tfm_export.cli.entry), so Python's default answered: a "
                   "KeyboardInterrupt traceback or death by the signal instead of 'interrupted', exit 130")
CLICK_ABORTED = ("known finding: the KeyboardInterrupt escaped tfm-export's own handlers and reached click's main, "
                 "which answered 'Aborted!' and exit 1 instead of 'interrupted', exit 130")


def signal_race(r: Result, sig: int) -> str | None:
    """Which known finding r shows, if any: Ctrl-C as Python's own KeyboardInterrupt with no frame of _run yet,
    SIGTERM or SIGHUP silently by their default action, or click's "Aborted!"."""
    if r.timed_out:
        return None
    if sig == signal.SIGINT and r.err_lines[-1:] == ["KeyboardInterrupt"] and ", in _run" not in r.err:
        return BEFORE_HANDLERS
    if sig != signal.SIGINT and r.rc == -sig and not r.err_lines:
        return BEFORE_HANDLERS
    return CLICK_ABORTED if r.rc == 1 and r.err_lines == ["Aborted!"] else None


def says(expected: str) -> Check:
    return lambda r: None if r.out.strip() == expected else f"translated as {short(r.out.strip(), 60)!r}, " \
                                                            f"expected {expected!r}"


def same_output(reference: str) -> Check:
    return lambda r: None if r.out == reference else f"output {short(r.out, 40)!r}, expected {short(reference, 40)!r}"


# --------------------------------------------------------------------------------------------------
# tree snapshots
# --------------------------------------------------------------------------------------------------

_HASHES: dict[tuple[int, int, int, int], str] = {}


def _hash(path: str, st: os.stat_result) -> str:
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError as exc:
            return f"unreadable:{exc.errno}"
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def _node(path: str) -> tuple | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    m = st.st_mode
    if stat.S_ISLNK(m):
        return ("link", os.readlink(path))
    if stat.S_ISREG(m):
        return ("file", _hash(path, st))
    if stat.S_ISDIR(m):
        return ("dir",)
    return ("fifo",) if stat.S_ISFIFO(m) else ("special", m)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every node under root: its type, and a file's sha256 or a link's target."""
    snap: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            node = _node(p)
            if node is not None:
                snap[p] = node
    return snap


def under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def device_state() -> dict[str, tuple | None]:
    state: dict[str, tuple | None] = {}
    for dev in DEVICES:
        try:
            st = os.lstat(dev)
            state[dev] = (stat.S_IFMT(st.st_mode), st.st_rdev)
        except OSError:
            state[dev] = None
    return state


def restore_device(dev: str, state: tuple | None) -> None:
    """If a tool replaced /dev/null or /dev/full with a file, put the device back (other users need it)."""
    if state is None:
        return
    try:
        if os.path.lexists(dev) and not stat.S_ISCHR(os.lstat(dev).st_mode):
            os.unlink(dev)
            os.mknod(dev, 0o666 | stat.S_IFCHR, state[1])
            os.chmod(dev, 0o666)
    except OSError as exc:
        print(f"WARNING: could not restore {dev}: {exc}", file=sys.stderr)
