"""Step speed from the pre-packed graphs against the directory's own graphs: one model directory loaded twice in one
process (`--prepacked-graphs on` and `off`), the same random sentences decoded by each in alternating order, round after
round; tokens/s per cell and the median on/off ratio with its spread (the packed weights must be what the steps use
either way, so the ratio should sit at 1 within the machine's noise):

    python -m tfm_export.benchmarks.prepacked_steps --model build/bench/base/onnx-fp32 --rounds 9 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from .. import DecodeOptions, Translator
from ..runtime.session import SessionOptions

CELLS = {"greedy, batch 1": (1, 1, 2), "greedy, batch 8": (1, 8, 8), "beam 4, batch 8": (4, 8, 8)}  # beam, batch, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a model directory with its .tfm-cache")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=64)
    args = parser.parse_args()
    loaded = {on: Translator.load(args.model, session_options=SessionOptions(prepacked_graphs=on,
                                                                             intra_op_threads=args.threads))
              for on in (True, False)}
    vocab = loaded[True].vocab.source.tokens()
    rng = np.random.default_rng(0)
    texts = [" ".join(vocab[i] for i in rng.integers(4, len(vocab), rng.integers(12, 24))) for _ in range(8)]
    rates: dict[tuple[str, bool], list[float]] = {(cell, on): [] for cell in CELLS for on in (True, False)}
    for r in range(args.rounds):
        for cell, (beam, batch, lines) in CELLS.items():
            options = DecodeOptions(beam_size=beam, max_length=args.max_length, batch_size=batch)
            for on in (True, False) if r % 2 == 0 else (False, True):
                start = time.perf_counter()
                out = loaded[on].translate(texts[:lines], options)
                rates[(cell, on)].append(sum(len(o.ids) for o in out) / (time.perf_counter() - start))
    print(f"| {args.model.name} | graph cache on tok/s | off tok/s | on / off (median; min-max) |")
    print("|---|---:|---:|---:|")
    for cell in CELLS:
        on, off = rates[(cell, True)], rates[(cell, False)]
        ratios = [a / b for a, b in zip(on, off, strict=True)]
        print(f"| {cell} | {statistics.median(on):.0f} | {statistics.median(off):.0f} | "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")
    print(f"\n{args.rounds} rounds, {args.threads} threads, at most {args.max_length} tokens")


if __name__ == "__main__":
    main()
