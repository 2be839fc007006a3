"""Console-script entry points. They install the signal handling before anything heavy is imported, so
Ctrl-C, SIGTERM or SIGHUP at any moment (even while PyTorch loads) ends with "interrupted", exit 130, and the
staging directories of an unfinished write removed."""

from __future__ import annotations

import signal
import sys
from typing import Any


def terminated(signum: int, frame: Any) -> None:
    """SIGTERM (kill, timeout, a cancelled CI job) and SIGHUP (a closed terminal) unwind like Ctrl-C."""
    raise KeyboardInterrupt


def handle_signals() -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, terminated)


def interrupted(exc: KeyboardInterrupt) -> None:
    """One line (with what was kept, when the interrupted command says) and exit 130."""
    print(f"interrupted: {exc}" if str(exc) else "interrupted", file=sys.stderr)
    sys.exit(130)


def _run(command: str) -> None:
    handle_signals()
    try:
        if command == "tfm-export":
            from .export_cli import main
        else:
            from .run_cli import main
        main(prog_name=command)
    except KeyboardInterrupt as exc:
        interrupted(exc)
    except ImportError as exc:  # some extension modules (onnxruntime's) turn an interrupted import into this
        if not _caused_by_interrupt(exc):
            raise
        interrupted(KeyboardInterrupt())


def _caused_by_interrupt(exc: BaseException | None) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def export_main() -> None:
    _run("tfm-export")


def run_main() -> None:
    from ..core.machine import return_large_blocks
    return_large_blocks()
    _run("tfm-run")
