"""`tfm-export generate`: a model directory plus generate.onnx (registered on tfm-export's group)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..core.extras import require_extra


@click.command("generate")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="A model directory: fp32, int8, or fp16 made with --keep-io-types.")
@click.option("--output", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Directory to create: the model directory's files plus generate.onnx.")
@click.option("--early-stopping", is_flag=True,
              help="Make the op stop an input once it has num_beams finished hypotheses (and let one call decode "
                   "a batch). Default: the op's heuristic that keeps searching while a running beam could still "
                   "win, closest to tfm-run's beam search; run one input per call.")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def generate(model_dir: Path, output: Path, early_stopping: bool, force: bool) -> None:
    """Write generate.onnx: ONNX Runtime's BeamSearch op running the whole greedy or beam search over the
    directory's encoder and decoder_step graphs, in one session.run from any language (docs/graph-contract.md).
    Ends by decoding with it and with the decoding loop, which must agree. Run it with
    `tfm-run translate --model OUTPUT --backend onnxruntime-generate`."""
    require_extra("export", "tfm-export generate")
    from ..graphs.generate_dir import write_generate_dir
    manifest = write_generate_dir(model_dir, output, early_stopping, force, progress=sys.stderr.isatty())
    entry = manifest.generate
    op = entry.extra
    size = (output / entry.file).stat().st_size / 1e6
    click.echo(f"wrote {output}: {entry.file} ({size:.1f} MB, {op['op']}, early_stopping "
               f"{int(op['early_stopping'])}, max_length up to {op['max_length']} with <s>)")
