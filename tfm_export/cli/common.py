"""What every command shares: one-line errors instead of tracebacks, and the --vocab option."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import TfmExportError


class ErrorReportingGroup(click.Group):
    """Turns a TfmExportError (bad input) into `error: ...` on stderr and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TfmExportError as exc:
            raise click.ClickException(str(exc)) from None
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
