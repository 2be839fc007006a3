"""`tfm-run`: translate text with a model."""

from __future__ import annotations

from pathlib import Path

import click

from ..checkpoint import load_checkpoint
from ..translate import DecodeOptions, translate_texts
from .common import ErrorReportingGroup, read_text_lines, setup_logging, vocab_option


@click.group(cls=ErrorReportingGroup)
@click.option("-v", "--verbose", is_flag=True, help="Log progress and warnings.")
def main(verbose: bool) -> None:
    """Run exported or PyTorch translation models."""
    setup_logging(verbose)


def read_lines(input_file: Path | None, texts: tuple[str, ...]) -> list[str]:
    """TEXT arguments, else the input file, else stdin; one sentence per line."""
    return list(texts) if texts else read_text_lines(input_file)


@main.command()
@click.argument("texts", nargs=-1)
@click.option("--model", "model_path", required=True, type=click.Path(path_type=Path),
              help="A checkpoint (.pt) for --backend torch.")
@vocab_option
@click.option("--backend", type=click.Choice(["torch"]), default="torch", show_default=True,
              help="Which runtime decodes.")
@click.option("--beam-size", type=click.IntRange(1, 64), default=1, show_default=True, help="1 = greedy.")
@click.option("--length-penalty", type=float, default=1.0, show_default=True,
              help="Beam hypotheses are ranked by score / length ** this.")
@click.option("--max-length", type=click.IntRange(min=1), default=None,
              help="Most tokens to generate (default: the model's positions).")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--truncate", is_flag=True, help="Cut sources longer than the model's positions instead of failing.")
@click.option("--input", "input_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Read sentences from this file (one per line) instead of TEXT or stdin.")
def translate(texts: tuple[str, ...], model_path: Path, vocab: tuple[Path, ...], backend: str, beam_size: int,
              length_penalty: float, max_length: int | None, batch_size: int, truncate: bool,
              input_file: Path | None) -> None:
    """Translate TEXT arguments, a file or stdin; prints one translation per line, in input order."""
    lines = read_lines(input_file, texts)
    ckpt = load_checkpoint(model_path, list(vocab))
    options = DecodeOptions(beam_size, length_penalty, max_length, batch_size, truncate)
    for result in translate_texts(ckpt, lines, options):
        click.echo(result.text)
