"""generate.onnx against tfm-run's decoding loop, for README: token-identical outputs and decode time on the same
inputs, per decoding setting; the loop at tfm-run's default batch and at one input per call (as generate.onnx
runs), all timed side by side, interleaved, several times.

    python experiments/generate_agreement.py --model build/demo-generate --input models/demo/heldout.en.txt
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import replace
from pathlib import Path

from tfm_export import DecodeOptions, Translator
from tfm_export.core.sources import read_text_lines
from tfm_export.runtime.session import SessionOptions

PENALTIES = (1.0, 0.6, 0.0, 2.0)
SETTINGS = {"greedy": DecodeOptions(),
            **{f"beam 4, length penalty {a}": DecodeOptions(beam_size=4, length_penalty=a) for a in PENALTIES}}


def timed(translator: Translator, lines: list[str], options: DecodeOptions) -> tuple[list[tuple[int, ...]], float]:
    start = time.perf_counter()
    ids = [r.ids for r in translator.translate(lines, options)]
    return ids, time.perf_counter() - start


def compare_batches(loop: Translator, generate: Translator, lines: list[str], repeats: int,
                    settings: dict[str, DecodeOptions]) -> None:
    """The same graph sent whole batches, as a graph made with --early-stopping is: with early_stopping 0 that is
    where ONNX Runtime checks an input's stopping rule on another input's scores."""
    searcher = copy.copy(generate.searcher)
    searcher.batched = True
    batched = Translator(searcher, generate.vocab, generate.config)
    print(f"{len(lines)} inputs; {repeats} interleaved runs each; median seconds")
    print("| decoding | one input per call: identical to tfm-run, time | batches of 32: identical, time |")
    print("|---|---|---|")
    for name, setting in settings.items():
        want = [r.ids for r in loop.translate(lines, setting)]
        runs = {"one": generate, "batch": batched}
        seconds: dict[str, list[float]] = {key: [] for key in runs}
        same = {}
        for _ in range(repeats):
            for key, translator in runs.items():
                got, took = timed(translator, lines, setting)
                seconds[key].append(took)
                same[key] = sum(g == w for g, w in zip(got, want, strict=True))
        one, batch = (statistics.median(seconds[key]) for key in runs)
        print(f"| {name} | {same['one']}/{len(lines)}, {one:.2f} s | {same['batch']}/{len(lines)}, {batch:.2f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a directory made by tfm-export generate")
    parser.add_argument("--input", type=Path, required=True, help="sentences, one per line")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each backend, interleaved")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0: its default)")
    parser.add_argument("--only", choices=list(SETTINGS), default=None, help="one decoding setting (default: all)")
    parser.add_argument("--op-batches", action="store_true",
                        help="instead, time generate.onnx one input per call against whole batches of 32 per call "
                             "(the first two settings: greedy, beam 4 at penalty 1.0)")
    args = parser.parse_args()
    lines = read_text_lines(args.input)
    settings = {args.only: SETTINGS[args.only]} if args.only else SETTINGS
    options = SessionOptions(intra_op_threads=args.threads)
    loop = Translator.load(args.model, backend="onnxruntime", session_options=options)
    generate = Translator.load(args.model, backend="onnxruntime-generate", session_options=options)
    if args.op_batches:
        compare_batches(loop, generate, lines, args.repeats, dict(list(settings.items())[:2]))
        return
    print(f"{len(lines)} inputs from {args.input}; {args.repeats} interleaved runs each; median seconds")
    calls = "batches of 32" if generate.searcher.batched else "one input per call"
    print("| decoding | identical to tfm-run | tfm-run, batch 32 | tfm-run, one input per call | "
          f"generate.onnx, {calls} | generate.onnx / tfm-run one per call |")
    print("|---|---|---|---|---|---|")
    for name, setting in settings.items():
        runs = {"loop": (loop, setting), "loop 1": (loop, replace(setting, batch_size=1)), "op": (generate, setting)}
        seconds: dict[str, list[float]] = {key: [] for key in runs}
        ids = {}
        for _ in range(args.repeats):
            for key, (translator, options) in runs.items():
                ids[key], took = timed(translator, lines, options)
                seconds[key].append(took)
        same = sum(g == w for g, w in zip(ids["op"], ids["loop"], strict=True))
        median = {key: statistics.median(values) for key, values in seconds.items()}
        print(f"| {name} | {same}/{len(lines)} | {median['loop']:.2f} s | {median['loop 1']:.2f} s | "
              f"{median['op']:.2f} s | {median['loop 1'] / median['op']:.2f}x faster |")

if __name__ == "__main__":
    main()
