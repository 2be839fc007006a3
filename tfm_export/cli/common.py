"""What every command shares: one-line errors instead of tracebacks, and the --vocab option."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import InputTextError, TfmExportError


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


def split_lines(text: str) -> list[str]:
    """Lines split on \n only (str.splitlines also splits on form feeds, U+2028, ..., which would make the output
    longer than the input); a final newline ends the last line, \r\n counts as one break."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_text_lines(input_file: Path | None) -> list[str]:
    """Lines of a UTF-8 file, or of stdin when no file is given; bad bytes are a one-line error."""
    name = str(input_file) if input_file else "<stdin>"
    try:
        data = input_file.read_bytes() if input_file else sys.stdin.buffer.read()
    except OSError as exc:
        raise InputTextError(f"{name}: cannot read input ({exc.strerror})") from None
    try:
        return split_lines(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputTextError(f"{name}: line {line} is not valid UTF-8; convert the file to UTF-8") from None
