"""`tfm-run`: translate text with an exported model directory or a checkpoint."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from .. import __version__
from ..core.errors import InputTextError, TfmExportError
from ..core.files import check_output_path, streamed_text
from ..core.machine import MAX_THREADS
from ..core.sources import CHUNK_BATCHES, read_line_chunks
from ..runtime.backends import CONCAT, ONNXRUNTIME, backend_names
from ..runtime.session import OPT_LEVELS, PREPACKED_GRAPHS_ENV, SessionOptions
from ..runtime.step_graph import StepOptions
from ..runtime.translator import (
    LENGTH_PENALTY_RANGE,
    MAX_BEAM,
    DecodeOptions,
    Translation,
    Translator,
)
from .common import ErrorReportingGroup, drop_unwritable_stdout, setup_logging, vocab_option


@click.group(cls=ErrorReportingGroup, lazy_commands={"bench": f"{__package__}.bench_cli:bench"})
@click.option("-v", "--verbose", is_flag=True, help="Log progress and warnings.")
@click.version_option(__version__, message="%(prog)s %(version)s")
def main(verbose: bool) -> None:
    """Run exported or PyTorch translation models."""
    setup_logging(verbose)


def read_chunks(input_file: Path | None, texts: tuple[str, ...], batch_size: int) -> Iterator[list[str]]:
    """TEXT arguments, else the input file, else stdin; one sentence per line, in chunks of what has arrived
    (each bucketed by length over up to CHUNK_BATCHES batches)."""
    if texts and input_file is not None:
        raise InputTextError("give TEXT arguments or --input FILE, not both")
    if texts:
        for number, text in enumerate(texts, 1):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise InputTextError(f"TEXT argument {number} is not valid UTF-8") from None
        return iter([list(texts)])
    return read_line_chunks(input_file, batch_size * CHUNK_BATCHES)


def format_line(source: str, result: Translation, fmt: str) -> str:
    """One input's output: its translation (text), or a JSON object (jsonl). With --n-best above 1, text gives
    n_best lines of SCORE<TAB>TRANSLATION and jsonl an n_best list, best first, each scored by what ranks them;
    entries the beams did not finish are empty with score -inf (text) or null (jsonl: JSON has no infinity)."""
    alternatives = result.n_best if len(result.n_best) > 1 else ()
    if fmt == "text":
        return "\n".join(f"{a.score:.6f}\t{a.text}" for a in alternatives) if alternatives else result.text
    row = {"source": source, "translation": result.text, "tokens": list(result.tokens), "ids": list(result.ids),
           "score": round(result.score, 6), "time_ms": round(result.time_ms, 3), "truncated": result.truncated}
    if alternatives:
        row["n_best"] = [{"translation": a.text, "score": _json_score(a.score), "log_prob": _json_score(a.log_prob)}
                         for a in alternatives]
        row["n_best_count"] = result.n_best_count
    return json.dumps(row, ensure_ascii=False, allow_nan=False)


def _json_score(score: float) -> float | None:
    return round(score, 6) if math.isfinite(score) else None


@contextlib.contextmanager
def output_stream(output: Path | None) -> Iterator[Callable[[list[str]], None]]:
    """write(lines) to stdout, each call flushed; or to --output, which is replaced only when every line is
    written (Ctrl-C keeps the lines done so far in OUTPUT.partial). A closed or full stdout is an error, never a
    silent exit 0 with the translations lost."""
    if output is not None:
        with streamed_text(output, "translations") as f:
            def write_file(lines: list[str]) -> None:
                f.write("".join(line + "\n" for line in lines))
                f.flush()
            yield write_file
        return

    def write(lines: list[str]) -> None:
        try:
            sys.stdout.write("".join(line + "\n" for line in lines))  # a stdout closed at start raises
            sys.stdout.flush()  # TfmExportError (common.ClosedStdout)
        except BrokenPipeError:
            raise  # the reader left (`| head`): the command group ends quietly
        except (OSError, ValueError) as exc:  # a full device: what is buffered would fail again at exit
            drop_unwritable_stdout()
            raise TfmExportError(f"cannot write the translations to stdout ({getattr(exc, 'strerror', None) or exc}"
                                 "); pass --output FILE") from None
    yield write


@main.command()
@click.argument("texts", nargs=-1)
@click.option("--model", "model_path", required=True, type=click.Path(path_type=Path),
              help="An exported model directory (tfm-export onnx) or a checkpoint file (.pt).")
@vocab_option
@click.option("--backend", type=click.Choice(backend_names()), default=None,
              help="Default: tensorrt for an engine directory (tfm-export trt), onnxruntime for a model directory, "
                   "torch for a checkpoint. onnxruntime picks by directory and device: onnxruntime-inplace on the "
                   "CPU (decoder_step_search, its cache written in place), onnxruntime-device on a GPU (all decode "
                   "memory there), onnxruntime-concat (the contract's decoder_step) where the directory has no "
                   "decoder_step_search. onnxruntime-generate: generate.onnx, the whole search in one call.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Default: cuda for TensorRT engines, cpu otherwise.")
@click.option("--beam-size", type=click.IntRange(1, MAX_BEAM), default=None,
              help="1 = greedy. Default: the model's (a Hugging Face model's num_beams), else 1.")
@click.option("--length-penalty", type=click.FloatRange(*LENGTH_PENALTY_RANGE), default=None,
              help="Beam hypotheses are ranked by score / length ** this (0: by summed log-probability). Default: "
                   "the model's (a Hugging Face model's length_penalty), else 1.0.")
@click.option("--max-length", type=click.IntRange(min=1), default=None,
              help="Most tokens to generate (default: the model's positions).")
@click.option("--n-best", type=click.IntRange(min=1), default=1, show_default=True,
              help="Show this many best hypotheses per input, best first, scored by what ranks them (log-prob / "
                   "length ** length-penalty; needs --beam-size >= it): text gives that many lines "
                   "SCORE<TAB>TRANSLATION per input, jsonl an n_best list and n_best_count. Where the beams "
                   "finished fewer, the rest are empty, with score -inf (text) or null (jsonl).")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True,
              help="Sentences decoded together (grouped by length; output order is kept).")
@click.option("--source-lang", default=None,
              help="Multilingual models: the source language code, as the model spells it (NLLB eng_Latn, M2M100 "
                   "__en__, mBART en_XX). Default: the one the model's tokenizer was saved with.")
@click.option("--target-lang", default=None,
              help="Multilingual models: the target language code (NLLB fra_Latn, M2M100 __fr__, mBART fr_XX, "
                   "multilingual opus-mt >>fra<<). Default: the model's generation config; NLLB and M2M100 "
                   "models that name none need it.")
@click.option("--truncate", is_flag=True, help="Cut sources longer than the model's positions instead of failing.")
@click.option("--input", "input_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Read sentences from this file (one per line) instead of TEXT or stdin.")
@click.option("--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write translations here instead of stdout: replaced only when all are done; on Ctrl-C the "
                   "ones done so far are in OUTPUT.partial.")
@click.option("--format", "fmt", type=click.Choice(["text", "jsonl"]), default="text", show_default=True,
              help="jsonl adds tokens, ids, score, time_ms (its batch's decode time divided by the sentences in "
                   "the batch, not the sentence's own latency) and truncated (cut by the length limit before "
                   "</s>) per sentence.")
@click.option("--threads", type=click.IntRange(0, MAX_THREADS), default=0, envvar="TFM_THREADS", show_default=True,
              help="CPU threads for ONNX Runtime (0 = its default) or PyTorch. Env: TFM_THREADS.")
@click.option("--ort-opt-level", type=click.Choice(list(OPT_LEVELS)), default="all", envvar="TFM_ORT_OPT_LEVEL",
              show_default=True, help="ONNX Runtime graph optimisation level. Env: TFM_ORT_OPT_LEVEL.")
@click.option("--memory-arena/--no-memory-arena", default=None, envvar="TFM_ORT_ARENA",
              help="ONNX Runtime's CPU memory arena. Default: off for the CPU decoder that keeps its cache in place "
                   "(less peak memory, same speed), on for graphs that allocate the whole cache every step. "
                   "Env: TFM_ORT_ARENA=1/0.")
@click.option("--spinning/--no-spinning", default=True, envvar="TFM_ORT_SPINNING", show_default=True,
              help="ONNX Runtime's threads spin between the ops of a run and stop when it returns (faster steps, "
                   "a free core between them); --no-spinning: they sleep while they wait, for cores shared with "
                   "busy programs. Env: TFM_ORT_SPINNING=1/0.")
@click.option("--search-graph/--no-search-graph", default=True, envvar="TFM_ORT_SEARCH_GRAPH", show_default=True,
              help="On the CPU, decode with decoder_step_search (cache written in place, the search's top "
                   "candidates computed in the graph) where the model directory has it; --no-search-graph: the "
                   "graph contract's decoder_step, its logits reduced in NumPy (--backend onnxruntime-concat). "
                   "Env: TFM_ORT_SEARCH_GRAPH=1/0.")
@click.option("--fused/--no-fused", default=None, envvar="TFM_ORT_FUSED",
              help="decoder_step_search_fused (the same step in ONNX Runtime's attention kernels) where the model "
                   "directory has it: --fused wherever it has one (an fp16 directory on CUDA, say); --no-fused: "
                   "decoder_step_search, standard ONNX operators only. Default: where it pays, an fp32 directory "
                   "on the CPU. Env: TFM_ORT_FUSED=1/0.")
@click.option("--prepacked-graphs", "--graph-cache", "prepacked_graphs", type=click.Choice(["on", "off"]),
              default="on", envvar=list(PREPACKED_GRAPHS_ENV), show_default=True,
              help="On the CPU, open the model directory's pre-packed graphs (ONNX Runtime's optimised copies, their "
                   "weights already in this CPU's layout, made by `tfm-export onnx`, `quantize` or `prepack`) where "
                   "they were made for this machine, ONNX Runtime and graph, and their sha256 match: sessions built "
                   "without packing, the weights in shared file pages instead of private memory. Any that do not "
                   "match are not used (a one-line warning); nothing is written. On any device, the stamps the same "
                   "commands leave spare hashing files unchanged since they hashed them; off: every file hashed. "
                   "--graph-cache and TFM_GRAPH_CACHE: their earlier names. Env: TFM_PREPACKED_GRAPHS=on/off.")
@click.option("--ort-trt", is_flag=True, help="With --device cuda: ONNX Runtime's TensorRT execution provider first.")
@click.option("--tf32", is_flag=True, envvar="TFM_TF32",
              help="With --device cuda: fp32 matrix products in TF32 (faster on Ampere and later, ~1e-3 relative "
                   "error). Off by default, so that fp32 on CUDA is fp32. Env: TFM_TF32=1.")
@click.option("--cuda-graphs/--no-cuda-graphs", default=False, envvar="TFM_CUDA_GRAPHS", show_default=True,
              help="With --device cuda: capture each decode shape's step as a CUDA graph and replay it (the step's "
                   "kernels launched at once). Env: TFM_CUDA_GRAPHS=1/0.")
def translate(texts: tuple[str, ...], model_path: Path, vocab: tuple[Path, ...], backend: str | None,
              device: str | None, beam_size: int | None, length_penalty: float | None, max_length: int | None,
              n_best: int, batch_size: int, source_lang: str | None, target_lang: str | None, truncate: bool,
              input_file: Path | None, output: Path | None, fmt: str, threads: int, ort_opt_level: str,
              memory_arena: bool | None, spinning: bool, search_graph: bool, fused: bool | None, prepacked_graphs: str,
              ort_trt: bool, tf32: bool, cuda_graphs: bool) -> None:
    """Translate TEXT arguments, a file or stdin: one translation per line, in input order.

    Input is translated as it arrives and each translation is printed (and flushed) once every line before
    it is done, so a pipe gets its first lines back before it ends. Empty lines give empty lines. A line
    longer than the model's positions is an error naming the line (or is cut, with a warning, under
    --truncate). Ctrl-C keeps what was written; exit 130.
    """
    inputs = [p for p in (input_file, model_path, *vocab) if p]
    check_output_path(output, "--output", inputs)
    chunks = read_chunks(input_file, texts, batch_size)
    session = SessionOptions(intra_op_threads=threads, optimization=ort_opt_level, memory_arena=memory_arena,
                             spinning=spinning, device=device, prepacked_graphs=prepacked_graphs == "on",
                             tensorrt_ep=ort_trt, tf32=tf32, cuda_graphs=cuda_graphs)
    translator = Translator.load(model_path, vocab, contract_step(backend, search_graph), session,
                                 StepOptions(fused=fused))
    translator = translator.with_languages(source_lang, target_lang)
    check_output_path(output, "--output", [*inputs, *translator.vocab.files])  # a checkpoint's tokenizer too
    options = DecodeOptions(beam_size, length_penalty, max_length, batch_size, truncate, n_best)
    show = input_file is not None and sys.stderr.isatty()
    with output_stream(output) as write, progress_bar(show) as update:
        lines = 0
        for done in translator.translate_stream(chunks, options, progress=update):
            write([format_line(src, r, fmt) for src, r in done])
            lines += len(done)
        if not lines:
            raise InputTextError(f"{input_file or '<stdin>'}: is empty; nothing to translate")


def contract_step(backend: str | None, search_graph: bool) -> str | None:
    """--no-search-graph: the contract's decoder_step, which is onnxruntime-concat; with another backend it is
    contradiction, not a choice."""
    if search_graph:
        return backend
    if backend not in (None, ONNXRUNTIME, CONCAT):
        raise click.UsageError(f"--no-search-graph picks {CONCAT}; it does not apply to --backend {backend}")
    return CONCAT


@contextlib.contextmanager
def progress_bar(show: bool) -> Iterator[Callable[[int], object] | None]:
    """tqdm's update where a bar is shown; tqdm is imported only then (it costs a start-up ~20 ms otherwise)."""
    if not show:
        yield None
        return
    from tqdm import tqdm
    with tqdm(desc="translating", unit="line") as bar:
        yield bar.update

