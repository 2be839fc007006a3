"""What every command shares: one-line errors instead of tracebacks, and the --vocab option."""

from __future__ import annotations

import importlib
import io
import logging
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from ..core.errors import TfmExportError
from .signals import end_if_interrupted, handle_signals, interrupted


class OneLineUsageError(click.ClickException):
    """A bad option value as one line (click's own usage errors print the usage block first); exit code 2."""

    exit_code = 2


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange lets nan through (every comparison with it is false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number", param, ctx)
        return number


class ClosedStdout(io.TextIOBase):
    """Stands for a stdout that was closed at start: writing to it is an error, not output silently lost
    (commands that write only files run as usual)."""

    def write(self, text: str) -> int:
        raise TfmExportError("stdout is closed, so the output cannot be written; redirect it to a file, or pass "
                             "--output FILE where the command has it")


class ErrorReportingGroup(click.Group):
    """Turns a TfmExportError (bad input) into `Error: ...` on stderr and exit code 1, and a bad option into
    one line with exit code 2. lazy_commands: name -> "module:attribute" of subcommands imported only when named
    (or listed by --help), so that a command does not import what only another one needs."""

    def __init__(self, *args: Any, lazy_commands: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy_commands and name not in self.commands:
            module, attribute = self.lazy_commands[name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        """A signal while click parses the command line (one that arrived during an import is delivered again
        a moment later, often here) is "interrupted" too, not click's own "Aborted!" and exit 1."""
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt as exc:
            interrupted(exc)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            handle_signals()  # as entry.py does, for callers of the groups themselves
            if sys.stdout is None:  # started with stdout closed (`>&-`): what the command reports would be lost
                sys.stdout = ClosedStdout()
            result = super().invoke(ctx)
            sys.stdout.flush()
            return result
        except TfmExportError as exc:
            end_if_interrupted()
            raise click.ClickException(str(exc)) from None
        except BrokenPipeError:  # the reader left (`| head`): stop quietly, as a process killed by SIGPIPE would
            drop_unwritable_stdout()
            sys.exit(128 + signal.SIGPIPE)
        except OSError as exc:  # stdout on a full device: no command's own check names this
            end_if_interrupted()
            drop_unwritable_stdout()
            raise click.ClickException(f"cannot write to {exc.filename or 'stdout'} ({exc.strerror or exc})") from None
        except click.UsageError as exc:
            end_if_interrupted()
            command = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            raise OneLineUsageError(exc.format_message() + command) from None
        except KeyboardInterrupt as exc:
            interrupted(exc)


def drop_unwritable_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's flush at exit does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s: %(message)s", stream=sys.stderr)


vocab_option = click.option(
    "--vocab", "vocab", multiple=True, type=click.Path(path_type=Path, dir_okay=False),
    help="Vocabulary: a tokenizers JSON, a JSON list/dict or one token per line. Needed for seed-format "
         "checkpoints; give it twice (source, then target) for split vocabularies.")
