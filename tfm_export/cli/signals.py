"""Ctrl-C, SIGTERM or SIGHUP at any moment (even while PyTorch loads) end with "interrupted" and exit 130: the
handlers every command installs before anything heavy is imported."""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
RETRY_S = 0.05  # a signal that arrives during an import is delivered again this much later
IMPORTING = "<frozen importlib._bootstrap"  # the file name of the frames that run an import
_pending: set[int] = set()  # signals deferred past an import and not yet delivered again
_ending = False  # interrupted() is ending the command: a signal that comes again is let go


def unwind(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C, SIGTERM (kill, timeout, a cancelled CI job) and SIGHUP (a closed terminal) unwind as
    KeyboardInterrupt, except during an import: an extension module interrupted while it initialises may abort
    the whole process (PyTorch's `import torch` ends in std::terminate, exit 134, when a KeyboardInterrupt
    reaches Python code it calls back), so there the signal is sent again a moment later, after the import, and
    is pending until then (deliver_pending: a command that ends first is interrupted all the same)."""
    if _ending:
        return
    if _importing(frame):
        _pending.add(signum)
        retry = threading.Timer(RETRY_S, _again, (signum,))
        retry.daemon = True
        retry.start()
        return
    _pending.clear()
    raise KeyboardInterrupt


def _again(signum: int) -> None:
    if signum in _pending:
        os.kill(os.getpid(), signum)


def deliver_pending() -> None:
    """A signal deferred past an import that the command outran (it ended, or failed, before the signal came
    again) is delivered now: the command says "interrupted", whatever it would have said."""
    if _pending:
        _pending.clear()
        raise KeyboardInterrupt


def end_if_interrupted() -> None:
    """Before a command reports its error: a signal still pending ends it as "interrupted" instead (the user
    stopped it; the error is not what they waited for)."""
    if _pending:
        interrupted(KeyboardInterrupt())


def _importing(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith(IMPORTING):
            return True
        frame = frame.f_back
    return False


def handle_signals() -> None:
    global _ending
    _ending = False
    for signum in SIGNALS:
        signal.signal(signum, unwind)


def interrupted(exc: KeyboardInterrupt) -> None:
    """One line (with what was kept, when the interrupted command says) and exit 130; a signal sent again after
    an import, still on its way, is ignored."""
    global _ending
    _pending.clear()
    _ending = True
    print(f"interrupted: {exc}" if str(exc) else "interrupted", file=sys.stderr)
    sys.exit(130)
