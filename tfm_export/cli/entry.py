"""Console-script entry points. They install the signal handling before anything heavy is imported, so
Ctrl-C or SIGTERM at any moment (even while PyTorch loads) ends with "interrupted", exit 130, and the
staging directories of an unfinished write removed."""

from __future__ import annotations

import signal
import sys
from typing import Any


def terminated(signum: int, frame: Any) -> None:
    """SIGTERM (kill, timeout, a cancelled CI job) unwinds like Ctrl-C."""
    raise KeyboardInterrupt


def _run(command: str) -> None:
    signal.signal(signal.SIGTERM, terminated)
    try:
        if command == "tfm-export":
            from .export_cli import main
        else:
            from .run_cli import main
        main(prog_name=command)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def export_main() -> None:
    _run("tfm-export")


def run_main() -> None:
    _run("tfm-run")
