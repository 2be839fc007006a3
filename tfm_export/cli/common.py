"""What every command shares: one-line errors instead of tracebacks, and the --vocab option."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from ..core.errors import TfmExportError


class ErrorReportingGroup(click.Group):
    """Turns a TfmExportError (bad input) into `error: ...` on stderr and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        signal.signal(signal.SIGTERM, _terminated)  # so staged outputs are removed, as on Ctrl-C
        try:
            return super().invoke(ctx)
        except TfmExportError as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM (kill, timeout, a cancelled CI job) unwinds like Ctrl-C: every staging directory is removed."""
    raise KeyboardInterrupt


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s: %(message)s", stream=sys.stderr)


vocab_option = click.option(
    "--vocab", "vocab", multiple=True, type=click.Path(path_type=Path, dir_okay=False),
    help="Vocabulary: a tokenizers JSON, a JSON list/dict or one token per line. Needed for seed-format "
         "checkpoints; give it twice (source, then target) for split vocabularies.")


def writable_output(path: Path | None, option: str, directory: bool = False) -> None:
    """Fail before any slow work when an output cannot be written: missing parent folders are made (as
    for `verify --report`), the place must be writable and of the right kind."""
    if path is None:
        return
    folder = path if directory else path.parent
    if (path.is_dir() and not directory) or (path.exists() and directory and not path.is_dir()):
        raise TfmExportError(f"{path}: is a {'directory' if path.is_dir() else 'file'}; choose another {option}")
    blocking = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise TfmExportError(f"{blocking}: is a file, not a folder; choose another {option}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TfmExportError(f"{folder}: cannot create it ({exc.strerror}); choose another {option}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise TfmExportError(f"{folder}: not writable; choose another {option}")
