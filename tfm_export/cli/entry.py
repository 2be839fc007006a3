"""Console-script entry points. They install the signal handling before anything heavy is imported, so
Ctrl-C, SIGTERM or SIGHUP at any moment (even while PyTorch loads) ends with "interrupted", exit 130, and the
staging directories of an unfinished write removed."""

from __future__ import annotations

from .signals import deliver_pending, handle_signals, interrupted


def _run(command: str) -> None:
    handle_signals()
    try:
        try:
            if command == "tfm-export":
                from .export_cli import main
            else:
                from ..core.machine import return_large_blocks
                return_large_blocks()  # before anything allocates
                from .run_cli import main
            main(prog_name=command)
        finally:  # click ends every command in sys.exit; a signal still pending outranks its code
            deliver_pending()
    except KeyboardInterrupt as exc:
        interrupted(exc)


def export_main() -> None:
    _run("tfm-export")


def run_main() -> None:
    _run("tfm-run")
