"""What every command shares: one-line errors instead of tracebacks, and the --vocab option."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any

import click

from ..core.errors import TfmExportError
from .entry import terminated


class OneLineUsageError(click.ClickException):
    """A bad option value as one line (click's own usage errors print the usage block first); exit code 2."""

    exit_code = 2


class ErrorReportingGroup(click.Group):
    """Turns a TfmExportError (bad input) into `Error: ...` on stderr and exit code 1, and a bad option into
    one line with exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        signal.signal(signal.SIGTERM, terminated)  # as entry.py does, for callers of the groups themselves
        try:
            return super().invoke(ctx)
        except TfmExportError as exc:
            raise click.ClickException(str(exc)) from None
        except click.UsageError as exc:
            command = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            raise OneLineUsageError(exc.format_message() + command) from None
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s: %(message)s", stream=sys.stderr)


vocab_option = click.option(
    "--vocab", "vocab", multiple=True, type=click.Path(path_type=Path, dir_okay=False),
    help="Vocabulary: a tokenizers JSON, a JSON list/dict or one token per line. Needed for seed-format "
         "checkpoints; give it twice (source, then target) for split vocabularies.")
