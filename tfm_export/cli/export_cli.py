"""`tfm-export`: build, check and export models."""

from __future__ import annotations

from pathlib import Path

import click
import torch

from .. import demo_numbers
from ..checkpoint import load_checkpoint
from ..train import TrainSettings, train_demo
from ..translate import DecodeOptions, translate_texts
from .common import ErrorReportingGroup, setup_logging, vocab_option


@click.group(cls=ErrorReportingGroup)
@click.option("-v", "--verbose", is_flag=True, help="Log progress and warnings.")
def main(verbose: bool) -> None:
    """Export encoder-decoder Transformers for ONNX Runtime and TensorRT."""
    setup_logging(verbose)


@main.command("train-demo")
@click.option("--output", type=click.Path(path_type=Path, file_okay=False), default=Path("models/demo"),
              show_default=True, help="Directory for ckpt.pt and tokenizer.json.")
@click.option("--steps", type=click.IntRange(min=1), default=TrainSettings.steps, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=TrainSettings.batch_size, show_default=True)
@click.option("--seed", type=int, default=TrainSettings.seed, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Torch CPU threads (default: all cores).")
def train_demo_cmd(output: Path, steps: int, batch_size: int, seed: int, threads: int | None) -> None:
    """Train the demo model: English number words -> French number words (0..999,999)."""
    if threads:
        torch.set_num_threads(threads)
    path, minutes = train_demo(output, TrainSettings(steps=steps, batch_size=batch_size, seed=seed))
    click.echo(f"saved {path} after {minutes:.1f} min of training")


@main.command("eval-demo")
@click.option("--checkpoint", type=click.Path(path_type=Path), default=Path("models/demo/ckpt.pt"),
              show_default=True)
@vocab_option
@click.option("--beam-size", type=click.IntRange(1, 64), default=1, show_default=True, help="1 = greedy.")
@click.option("--show-misses", type=click.IntRange(min=0), default=5, show_default=True)
def eval_demo(checkpoint: Path, vocab: tuple[Path, ...], beam_size: int, show_misses: int) -> None:
    """Exact match on the 1,000 held-out numbers that training never saw."""
    ckpt = load_checkpoint(checkpoint, list(vocab))
    pairs = demo_numbers.held_out_pairs()
    results = translate_texts(ckpt, [en for en, _ in pairs], DecodeOptions(beam_size=beam_size, batch_size=100))
    score, misses = demo_numbers.exact_match([r.text for r in results], [fr for _, fr in pairs])
    decoding = "greedy" if beam_size == 1 else f"beam {beam_size}"
    click.echo(f"exact match: {100 * score:.1f}% ({len(pairs) - len(misses)}/{len(pairs)}) "
               f"held-out numbers, {decoding}")
    for i in misses[:show_misses]:
        click.echo(f"  {pairs[i][0]!r} -> {results[i].text!r} (expected {pairs[i][1]!r})")
