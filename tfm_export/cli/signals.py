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


def unwind(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C, SIGTERM (kill, timeout, a cancelled CI job) and SIGHUP (a closed terminal) unwind as
    KeyboardInterrupt, except during an import: an extension module interrupted while it initialises may abort
    the whole process (PyTorch's `import torch` ends in std::terminate, exit 134, when a KeyboardInterrupt
    reaches Python code it calls back), so there the signal is sent again a moment later, after the import."""
    if _importing(frame):
        retry = threading.Timer(RETRY_S, os.kill, (os.getpid(), signum))
        retry.daemon = True
        retry.start()
        return
    raise KeyboardInterrupt


def _importing(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith(IMPORTING):
            return True
        frame = frame.f_back
    return False


def handle_signals() -> None:
    for signum in SIGNALS:
        signal.signal(signum, unwind)


def interrupted(exc: KeyboardInterrupt) -> None:
    """One line (with what was kept, when the interrupted command says) and exit 130."""
    print(f"interrupted: {exc}" if str(exc) else "interrupted", file=sys.stderr)
    sys.exit(130)
