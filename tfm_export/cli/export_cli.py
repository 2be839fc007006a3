"""`tfm-export`: build, check and export models."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .. import __version__
from ..artifacts.engine_dir import TARGET_NAMES, TENSORRT
from ..artifacts.model_dir import INT8_MODES, PRECISIONS, WEIGHTS_FILE
from ..core.config import TrainSettings
from ..core.errors import TfmExportError
from ..core.extras import require_extra
from ..core.files import check_output_path
from ..core.graph_spec import DEFAULT_OPSET, SUPPORTED_OPSETS
from ..core.machine import MAX_THREADS
from ..graphs.parity import (
    AGREEMENT_BEAM,
    DEFAULT_TOLERANCE,
    MAX_SAMPLES,
    MAX_STEPS,
    MIN_AGREEMENT,
    SAMPLES,
    STEPS,
)
from ..runtime.backends import backend_names
from ..runtime.translator import MAX_BEAM
from ..serving.contract import (
    DEFAULT_MAX_BATCH,
    DEFAULT_NAME,
    DEVICES,
    LAYOUTS,
    SERVE_HOST,
    SERVE_PORTS,
    SERVING_VENV,
)
from .common import ErrorReportingGroup, FiniteFloatRange, setup_logging, vocab_option
from .generate_cli import generate
from .variant_options import variant_from_flags, variant_options

QUANTIZED = [p for p in PRECISIONS if p != "fp32"]
WEIGHT_LAYOUTS = {"auto": None, "inline": False, "external": True}  # --weights -> export_model_dir's external_data


@click.group(cls=ErrorReportingGroup, epilog="Typical use: tfm-export onnx --checkpoint ckpt.pt --output model/ "
              "&& tfm-export verify --model model/ && tfm-run translate --model model/ 'some text'")
@click.option("-v", "--verbose", is_flag=True, help="Log progress and warnings.")
@click.version_option(__version__, message="%(prog)s %(version)s")
def main(verbose: bool) -> None:
    """Export encoder-decoder Transformers for ONNX Runtime and TensorRT."""
    setup_logging(verbose)


@main.command("train-demo")
@click.option("--output", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Directory for ckpt.pt and tokenizer.json (default: models/demo for the classic model, "
                   "models/demo-PRESET for another architecture).")
@click.option("--steps", type=click.IntRange(1, TrainSettings.MAX_STEPS), default=TrainSettings.steps,
              show_default=True)
@click.option("--batch-size", type=click.IntRange(1, TrainSettings.MAX_BATCH_SIZE), default=TrainSettings.batch_size,
              show_default=True)
@click.option("--seed", type=int, default=TrainSettings.seed, show_default=True)
@click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=None,
              help="Torch CPU threads (default: all cores).")
@click.option("--force", is_flag=True, help="Replace a checkpoint or tokenizer already in --output.")
@variant_options
def train_demo_cmd(output: Path | None, steps: int, batch_size: int, seed: int, threads: int | None, force: bool,
                   **variant) -> None:
    """Train the demo model: English number words -> French number words (0..999,999)."""
    require_extra("export", "tfm-export train-demo")
    import torch

    from ..demo.train import DEMO_LAYERS, default_output, train_demo
    preset, architecture = variant["preset"], variant_from_flags(variant, DEMO_LAYERS)
    output = output or default_output(preset, architecture)
    if threads:
        torch.set_num_threads(threads)
    path, minutes = train_demo(output,
                               TrainSettings(steps=steps, batch_size=batch_size, seed=seed), force=force,
                               variant=architecture)
    click.echo(f"saved {path} after {minutes:.1f} min of training")


@main.command("eval-demo")
@click.option("--model", "--checkpoint", "model_path", type=click.Path(path_type=Path),
              default=Path("models/demo/ckpt.pt"), show_default=True,
              help="The demo checkpoint, or a model directory exported from it.")
@vocab_option
@click.option("--backend", type=click.Choice(backend_names()), default=None,
              help="Default: tensorrt for an engine directory, onnxruntime for a model directory, torch for a "
                   "checkpoint.")
@click.option("--beam-size", type=click.IntRange(1, 64), default=1, show_default=True, help="1 = greedy.")
@click.option("--show-misses", type=click.IntRange(min=0), default=5, show_default=True)
def eval_demo(model_path: Path, vocab: tuple[Path, ...], backend: str | None, beam_size: int, show_misses: int) -> None:
    """Exact match on the 1,000 held-out numbers that training never saw."""
    require_extra("export", "tfm-export eval-demo")  # the held-out numbers come from num2words
    from ..demo.evaluate import evaluate_demo
    from ..runtime.translator import Translator
    for line in evaluate_demo(Translator.load(model_path, vocab, backend), beam_size).lines(show_misses):
        click.echo(line)


@main.command("random-checkpoint")
@click.option("--output", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Directory for ckpt.pt and tokenizer.json (tokens w0, w1, ...).")
@click.option("--d-model", type=click.IntRange(min=8), default=512, show_default=True)
@click.option("--heads", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--layers", type=click.IntRange(min=1), default=6, show_default=True, help="Encoder and decoder each.")
@click.option("--ffn", type=click.IntRange(min=1), default=2048, show_default=True)
@click.option("--vocab-size", type=click.IntRange(min=8), default=32000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--force", is_flag=True, help="Replace a checkpoint or tokenizer already in --output.")
@variant_options
def random_checkpoint_cmd(output: Path, d_model: int, heads: int, layers: int, ffn: int, vocab_size: int,
                          seed: int, force: bool, **variant) -> None:
    """A random-weight model (default: the base config) for benchmarks: real shapes, meaningless outputs.
    --preset and the architecture flags choose the variant."""
    require_extra("export", "tfm-export random-checkpoint")
    from ..core.config import ModelConfig
    from ..model.synthetic import random_checkpoint
    if d_model % heads:
        raise TfmExportError(f"--d-model {d_model} is not a multiple of --heads {heads}")
    config = ModelConfig(src_vocab_size=vocab_size, trg_vocab_size=vocab_size, d_model=d_model, d_inner=ffn,
                         n_layers=layers, n_head=heads, d_k=d_model // heads, d_v=d_model // heads,
                         **variant_from_flags(variant, layers))
    check_output_path(output, "--output", directory=True)
    click.echo(f"wrote {random_checkpoint(config, output, seed, force)}")


@main.command("onnx")
@click.option("--checkpoint", type=click.Path(path_type=Path), required=True,
              help="A tfm-export or seed train.py checkpoint, or a local Hugging Face model directory (Marian/"
                   "opus-mt, M2M100/NLLB, BART, mBART, T5, mT5: config.json, weights, tokenizer files).")
@vocab_option
@click.option("--output", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Model directory to create (encoder.onnx, decoder_step.onnx, manifest.json, tokenizer).")
@click.option("--opset", type=click.Choice([str(o) for o in SUPPORTED_OPSETS]), default=str(DEFAULT_OPSET),
              show_default=True, help="ONNX opset; both keep LayerNormalization as one op. 17 parses in TensorRT 8.6 "
                                      "(JetPack 6.0) and later; 18 needs TensorRT 10.")
@click.option("--no-optimize", is_flag=True, help="Skip the exporter's graph optimizer (constant folding etc.).")
@click.option("--no-prepack", is_flag=True,
              help="Leave out the pre-packed graphs (.tfm-cache/, made for this machine's CPU and ONNX Runtime; "
                   "see `tfm-export prepack`). Models past 2 GB of weights leave them out unasked.")
@click.option("--weights", type=click.Choice(WEIGHT_LAYOUTS), default="auto", show_default=True,
              help="Where the graphs keep their weights. inline: inside each graph file (below protobuf's 2 GB). "
                   f"external: every graph's in one {WEIGHTS_FILE}, each tensor once (any size; a directory the "
                   "size of the weights). auto: external from 2 GB of weights.")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def onnx_cmd(checkpoint: Path, vocab: tuple[Path, ...], output: Path, opset: str, no_optimize: bool,
             no_prepack: bool, weights: str, force: bool) -> None:
    """Export encoder and decoder-step ONNX graphs with an explicit KV cache, checked against PyTorch."""
    require_extra("export", "tfm-export onnx")
    from ..graphs.pipeline import export_model_dir
    from ..model.loading import load_checkpoint
    ckpt = load_checkpoint(checkpoint, list(vocab))
    manifest = export_model_dir(ckpt, output, int(opset), optimize=not no_optimize, force=force,
                                progress=sys.stderr.isatty(), prepacked=False if no_prepack else None,
                                external_data=WEIGHT_LAYOUTS[weights])
    click.echo(f"wrote {output}: {', '.join(g.file for g in manifest.graphs.values())}, manifest.json "
               f"(opset {manifest.opset}, {manifest.precision}, max {manifest.limits['max_source_length']} "
               "positions)")


@main.command("quantize")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="An fp32 model directory from `tfm-export onnx`.")
@click.option("--precision", type=click.Choice(QUANTIZED), required=True,
              help="fp16: for GPUs (TensorRT, CUDA). int8: Q/DQ graphs (static) or CPU int8 (dynamic).")
@click.option("--mode", type=click.Choice(INT8_MODES), default=None,
              help="int8 only (default static). static: explicit Q/DQ with calibrated ranges, for TensorRT and "
                   "int8 accelerators. dynamic: activations quantized per call, the fast choice for ONNX Runtime "
                   "on x86 CPUs.")
@click.option("--calibration", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="int8 static: sentences in the source language, one per line (e.g. calibration/demo.en.txt).")
@click.option("--calibration-max-length", type=click.IntRange(min=1), default=None,
              help="int8 static: stop tracing each calibration sentence after this many generated tokens "
                   "(default: at </s> or the model's positions).")
@click.option("--keep-io-types", is_flag=True,
              help="fp16: keep every float input/output fp32 (the KV cache too); default is fp16 cache tensors.")
@click.option("--float-embeddings", is_flag=True,
              help="int8: keep the embedding tables (and a projection tied to them) float instead of int8 per row; "
                   "about 2x larger graphs.")
@click.option("--output", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Model directory to create, same contract as the input.")
@click.option("--no-prepack", is_flag=True,
              help="Leave out the pre-packed graphs (.tfm-cache/, made for this machine's CPU and ONNX Runtime; "
                   "see `tfm-export prepack`).")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def quantize_cmd(model_dir: Path, precision: str, mode: str | None, calibration: Path | None,
                 calibration_max_length: int | None, keep_io_types: bool, float_embeddings: bool, output: Path,
                 no_prepack: bool, force: bool) -> None:
    """Make an fp16 or int8 model directory from an fp32 one (check it with `tfm-export verify`)."""
    require_extra("export", "tfm-export quantize")
    from ..precision.pipeline import Calibration, quantize_model_dir
    calib = Calibration.from_options(calibration, calibration_max_length)
    manifest = quantize_model_dir(model_dir, output, precision, mode, calib, keep_io_types, force,
                                  progress=sys.stderr.isatty(), float_embeddings=float_embeddings,
                                  prepacked=False if no_prepack else None)
    sizes = {g: (output / e.file).stat().st_size / 1e6 for g, e in manifest.graphs.items()}
    kind = f"int8 {manifest.int8_mode}" if precision == "int8" else precision
    click.echo(f"wrote {output}: {kind}, " + ", ".join(f"{g} {mb:.1f} MB" for g, mb in sizes.items()))


@main.command("prepack")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="A model directory (fp32, or int8 dynamic): its pre-packed graphs are (re)made inside it.")
def prepack_cmd(model_dir: Path) -> None:
    """Make the model directory's pre-packed graphs for this machine: ONNX Runtime's optimised copies of the graphs
    a CPU translation opens, their weights already in this CPU's layout (.tfm-cache/ inside the directory, each
    file's sha256 in its entry), and the stamps of every file it hashed. `tfm-run translate` then maps them instead
    of optimising and packing, and hashes no file unchanged since, at every start. Run it after copying a directory
    (to another machine, disk or path) or upgrading onnxruntime; old ones are replaced at once, and a failure leaves
    them as they were."""
    from ..runtime.prepacked import prepack
    from ..runtime.prepacked_graphs import PREPACKED_DIR
    made = prepack(model_dir)
    click.echo(f"wrote {model_dir / PREPACKED_DIR}: {', '.join(made)}")


@main.command("hf")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="A model directory (fp32, fp16 or int8): the seed model, a variant, or a Hugging Face family "
                   "(Marian, BART, T5, and NLLB, M2M100 and mBART-50 with their languages; not mBART-cc25).")
@click.option("--output", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Directory to create in Hugging Face's layout (onnx/*.onnx and the four JSON files).")
@click.option("--checkpoint", type=click.Path(path_type=Path), default=None,
              help="fp32: the checkpoint the directory was exported from; the layout's graphs are then held to "
                   "PyTorch (without it, to the directory's own graphs).")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def hf_cmd(model_dir: Path, output: Path, checkpoint: Path | None, force: bool) -> None:
    """Write a model directory in the layout transformers.js (`pipeline("translation", dir)`) and Optimum
    (`ORTModelForSeq2SeqLM.from_pretrained(dir)`) load as they are: onnx/encoder_model.onnx, the merged decoder
    (it computes the cross-attention keys and values at the first step), Optimum's decoder pair, config.json
    (model_type marian for the seed and its variants, a Hugging Face family's own), generation_config.json
    (tfm-run's decoding rules), tokenizer.json (rewritten where tokenizers.js would split otherwise) and
    tokenizer_config.json. fp16 and int8 files carry transformers.js's suffixes (_fp16; _quantized, its q8).
    Every graph is checked on the first step and with its past fed back before anything is written."""
    require_extra("export", "tfm-export hf")
    from ..hf_layout import export_hf
    view = export_hf(model_dir, output, checkpoint, force, progress=sys.stderr.isatty())
    for line in view.parity:
        click.echo(line)
    click.echo(f"wrote {output}: " + ", ".join(view.files))


@main.command("verify")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), required=True, help="Exported model directory.")
@click.option("--checkpoint", type=click.Path(path_type=Path), default=None,
              help="fp32: checkpoint to compare with (default: the one the manifest names, if still there).")
@click.option("--reference", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="fp16/int8: the fp32 directory to compare with (default: the parent the manifest names).")
@vocab_option
@click.option("--input", "input_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Real sentences, one per line (fp16/int8: required; all comparisons run on them).")
@click.option("--references", "references_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="fp16/int8: true translations of --input, line by line, for exact match and BLEU.")
@click.option("--report", "report_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="fp16/int8: write precision-report.md and error histograms (PNG) into this directory.")
@click.option("--samples", type=click.IntRange(1, MAX_SAMPLES), default=None,
              help=f"fp32: random sources decoded by both sides (default {SAMPLES}).")
@click.option("--steps", type=click.IntRange(1, MAX_STEPS), default=None,
              help=f"fp32: decoder steps compared with the cache fed back (default {STEPS}).")
@click.option("--beam-size", type=click.IntRange(1, MAX_BEAM), default=AGREEMENT_BEAM, show_default=True,
              help="Beam size of the beam-search agreement check (greedy is always checked).")
@click.option("--atol", type=FiniteFloatRange(0, 1), default=None,
              help=f"fp32: absolute tolerance of every tensor comparison (default {DEFAULT_TOLERANCE.atol}).")
@click.option("--rtol", type=FiniteFloatRange(0, 1), default=None,
              help=f"fp32: relative to the largest reference value of each tensor (default {DEFAULT_TOLERANCE.rtol}).")
@click.option("--min-agreement", type=FiniteFloatRange(0, 1), default=None,
              help="Fraction of decodes that must be token-identical (default: "
                   + ", ".join(f"{p} {v}" for p, v in MIN_AGREEMENT.items()) + ").")
def verify_cmd(model_dir: Path, checkpoint: Path | None, reference: Path | None, vocab: tuple[Path, ...],
               input_file: Path | None, references_file: Path | None, report_dir: Path | None, samples: int | None,
               steps: int | None, beam_size: int, atol: float | None, rtol: float | None,
               min_agreement: float | None) -> None:
    """fp32: compare ONNX Runtime with PyTorch (tensor errors step by step, greedy/beam agreement).
    fp16/int8: compare with the fp32 parent (per-graph errors, agreement, BLEU, exact match)."""
    require_extra("export", "tfm-export verify")
    from ..verify.directory import VerifyRequest, verify_model_dir
    request = VerifyRequest(model_dir, input_file, beam_size, min_agreement, checkpoint, vocab, samples, steps, atol,
                            rtol, reference, references_file, report_dir)
    inputs = [p for p in (model_dir, checkpoint, reference, input_file, references_file, *vocab) if p]
    outcome = verify_model_dir(request, lambda path: check_output_path(path, "--report", inputs, directory=True))
    for line in outcome.lines:
        click.echo(line)
    if outcome.failures:
        raise click.ClickException(f"{outcome.kind} check failed: " + "; ".join(outcome.failures))
    click.echo(outcome.summary)


@main.command("inspect")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), required=True, help="Exported model directory.")
def inspect_cmd(model_dir: Path) -> None:
    """Show graph inputs/outputs with shapes, op counts, sizes, precision and opset."""
    require_extra("export", "tfm-export inspect")
    from ..graphs.inspection import inspect_model, summary_lines
    for line in summary_lines(*inspect_model(model_dir)):
        click.echo(line)


@main.command("check")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="A model directory (fp32, fp16 or int8) from `tfm-export onnx` or `quantize`.")
@click.option("--trt", "with_trt", is_flag=True,
              help="Also run each graph in TensorRT (Polygraphy) and compare it with ONNX Runtime (needs TensorRT "
                   "and a GPU).")
def check_cmd(model_dir: Path, with_trt: bool) -> None:
    """Will these graphs build in TensorRT? A static report for TensorRT 8.6 (JetPack 6.0), 10.3 (JetPack
    6.1/6.2) and 11; a real build of every TensorRT-ready graph (TensorRT where it can build here, else
    TensorRT-RTX, which needs no GPU); then a Polygraphy run of every graph on generated inputs (past length 0
    included). Exit 1 on any problem."""
    require_extra("export", "tfm-export check")
    from ..artifacts.model_dir import ModelDir
    from ..trt.build_check import check_builds
    from ..trt.compat import check_model_dir
    from ..trt.polygraphy_check import check_onnxruntime
    if with_trt:
        from ..runtime.tensorrt_platform import current_platform
        ModelDir.read(model_dir)  # a wrong directory first: TensorRT would not help with that
        click.echo(current_platform().describe())
    report = check_model_dir(model_dir)
    for line in report.lines():
        click.echo(line)
    builds = check_builds(model_dir)
    for line in builds.lines():
        click.echo(line)
    runs = check_onnxruntime(model_dir, trt=with_trt)
    click.echo(f"Polygraphy runs on generated inputs ({len(runs)} checks):")
    for run in runs:
        click.echo(f"  {run.graph:21} {run.runner:26} {run.case:34} {run.problem or 'ok'}")
    failed = [r for r in runs if r.problem]
    if report.errors() or builds.failures() or failed:
        raise click.ClickException(f"{model_dir}: {len(report.errors())} compatibility problem(s), "
                                   f"{len(builds.failures())} failed build(s), {len(failed)} failed run(s); see above")
    click.echo("check OK")


@main.command("trt")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="A model directory: fp32 (with --fp16, the fp16 graphs are made from it), fp16, or int8 static.")
@click.option("--fp16", is_flag=True,
              help="fp16 engines (from the fp16 graphs; made from an fp32 directory if needed).")
@click.option("--int8", is_flag=True, help="int8 engines from an int8 static (Q/DQ) directory.")
@click.option("--output", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Engine directory to create: encoder.plan, decoder_step.plan, manifest.json, tokenizer.")
@click.option("--max-batch", type=click.IntRange(min=1), default=64, show_default=True,
              help="Most rows one call takes: sentences x beams.")
@click.option("--max-source-length", type=click.IntRange(min=1), default=None,
              help="Longest source, with <s> and </s> (default: the model's positions).")
@click.option("--max-target-length", type=click.IntRange(min=2), default=None,
              help="Longest target, <s> included (default: the model's positions).")
@click.option("--opt-batch", type=click.IntRange(min=1), default=None,
              help="Rows TensorRT tunes its kernels for (default: 8, or --max-batch if smaller).")
@click.option("--opt-source-length", type=click.IntRange(min=1), default=None,
              help="Source length TensorRT tunes for (default: 32, or the maximum if smaller).")
@click.option("--opt-past-length", type=click.IntRange(min=0), default=None,
              help="Cached target tokens TensorRT tunes the decoder step for (default: 32, or the maximum).")
@click.option("--timing-cache", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Read and update this timing cache, so later builds skip kernel timing.")
@click.option("--workspace", "workspace_mib", type=click.IntRange(min=1), default=None,
              help="Builder workspace limit in MiB (default: TensorRT's, the whole GPU memory).")
@click.option("--weak-typing", is_flag=True,
              help="TensorRT 10 only: build with builder precision flags instead of from the typed graphs.")
@click.option("--target", type=click.Choice(list(TARGET_NAMES)), default=TENSORRT, show_default=True,
              help="tensorrt: TensorRT, on this machine's GPU, for this GPU. rtx: TensorRT-RTX (pip install "
                   "'tfm-export[rtx]'), built on any machine without a GPU; the engines run on GPUs of compute "
                   "capability 8.0, 8.6, 8.9 and 12.0+ (not Hopper, not Jetson).")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def trt_cmd(model_dir: Path, fp16: bool, int8: bool, output: Path, max_batch: int, max_source_length: int | None,
            max_target_length: int | None, opt_batch: int | None, opt_source_length: int | None,
            opt_past_length: int | None, timing_cache: Path | None, workspace_mib: int | None, weak_typing: bool,
            target: str, force: bool) -> None:
    """Build TensorRT (or TensorRT-RTX) engines, one optimisation profile per graph, from a model directory.

    Precision comes from the graphs: fp32 by default, --fp16 (the fp16 graphs, made from an fp32 directory
    if needed) or --int8 (an int8 static directory). Run with `tfm-run translate --model OUTPUT`.
    """
    require_extra("export", "tfm-export trt")
    from ..runtime.tensorrt_platform import Platform
    from ..trt.build import build_engines
    from ..trt.profiles import ShapeLimits
    if fp16 and int8:
        raise TfmExportError("--fp16 and --int8 exclude each other: an engine has one precision")
    precision = "fp16" if fp16 else "int8" if int8 else None
    check_output_path(timing_cache, "--timing-cache", inputs=[model_dir])
    limits = ShapeLimits(max_batch, max_source_length, max_target_length, opt_batch, opt_source_length,
                         opt_past_length)
    manifest = build_engines(model_dir, output, precision, limits, timing_cache, workspace_mib, weak_typing, force,
                             progress=sys.stderr.isatty(), target=target)
    info = manifest.tensorrt
    click.echo(f"wrote {output}: {manifest.precision} engines ({info['precision_source']}), "
               f"{Platform.from_dict(info).describe()}")


@main.command("triton")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="A model directory (tfm-export onnx/quantize) or an engine directory (tfm-export trt).")
@click.option("--output", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Model repository to create (serve it here with tfm-export serve --repository OUTPUT).")
@click.option("--name", default=DEFAULT_NAME, show_default=True,
              help="Model name clients call; the bls layout adds NAME_encoder and NAME_decoder_step.")
@click.option("--layout", type=click.Choice(LAYOUTS), default=LAYOUTS[0], show_default=True,
              help="translator: one Python-backend model running tfm-export's Translator. bls: encoder and "
                   "decoder_step as native models (onnxruntime, or TensorRT for engines) and a Python model running "
                   "the decoding loop through them.")
@click.option("--max-batch", type=click.IntRange(min=1), default=None,
              help="Most rows (sentences x beams) per execution; the dynamic batcher gathers up to this many "
                   "sentences, and beam_size may not exceed it (default: the engines' profile, else "
                   f"{DEFAULT_MAX_BATCH}).")
@click.option("--instances", type=click.IntRange(min=1), default=1, show_default=True,
              help="Model instances per device (each a process of its own).")
@click.option("--device", type=click.Choice(DEVICES), default=None,
              help="Where instances run (default: gpu for engines, cpu for a model directory).")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def triton_cmd(model_dir: Path, output: Path, name: str, layout: str, max_batch: int | None, instances: int,
               device: str | None, force: bool) -> None:
    """Write a Triton Inference Server model repository that serves this model (text in, text out)."""
    require_extra("serving", "tfm-export triton")
    from ..serving.repository import RepositoryRequest, write_repository
    repository = write_repository(RepositoryRequest(model_dir, output, name, layout, max_batch, instances, device,
                                                    force))
    deployment = repository.deployment
    click.echo(f"wrote {output}: {layout} layout, models {', '.join(repository.models)} (max batch "
               f"{deployment.max_batch} rows, {deployment.instances} instance(s) on {deployment.device}); serve it "
               f"on this machine with: tfm-export serve --repository {output}")


@main.command("serve")
@click.option("--repository", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="A model repository written by tfm-export triton.")
@click.option("--host", default=SERVE_HOST, show_default=True, help="Address to listen on (0.0.0.0: all).")
@click.option("--http-port", type=click.IntRange(0, 65535), default=SERVE_PORTS[0], show_default=True,
              help="0: any free port.")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=SERVE_PORTS[1], show_default=True,
              help="0: any free port.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=SERVE_PORTS[2], show_default=True,
              help="0: any free port.")
@click.option("--serving-python", type=click.Path(path_type=Path, dir_okay=False), default=None,
              envvar="TFM_SERVING_PYTHON", help="The Python of an environment with nvidia-pytriton and tfm-export, "
              "whose tritonserver runs the repository. Default: this Python if it has nvidia-pytriton, else "
              f"{SERVING_VENV}/bin/python beside this environment (make serving-env). Env: TFM_SERVING_PYTHON.")
def serve_cmd(repository: Path, host: str, http_port: int, grpc_port: int, metrics_port: int,
              serving_python: Path | None) -> None:
    """Serve a model repository on this machine until Ctrl-C, with the tritonserver that nvidia-pytriton bundles
    (CPU, Python backend; no Docker)."""
    require_extra("serving", "tfm-export serve")
    from ..serving.local_server import serving
    try:
        with serving(repository, serving_python, host, (http_port, grpc_port, metrics_port)) as (server, models):
            click.echo(f"serving {repository} (models {', '.join(models)}) with {server.env.python}'s tritonserver\n"
                       f"  HTTP     http://{server.http_url}/v2/models/{models[0]}/infer\n"
                       f"  gRPC     {server.grpc_url}\n"
                       f"  metrics  http://{server.metrics_url}/metrics\n"
                       f"  log      {server.log_path}\n"
                       "Ctrl-C stops it.")
            server.wait()
    except KeyboardInterrupt:
        click.echo("stopped")


main.add_command(generate)
