"""What the device backend's fixed shapes cost, measured on the CPU: the demo's held-out sentences translated by the
in-place backend (rows shrink as inputs finish) and by the device backend on host memory (rows stay in place until
half the inputs are done, sources padded to a bucket, the cache's capacity doubling), interleaved round by round,
both on the same step graph (decoder_step_search; the CPU's default fused step is not what the GPU runs).

    python -m tfm_export.benchmarks.fixed_shapes --model build/demo-onnx --rounds 3 > build/bench/fixed-shapes.md

Per cell: sentences/s of each (best of the rounds), their ratio, and the wasted share: the row-steps the device
backend computed for rows that had already finished, over all row-steps it computed. On a GPU a wasted row costs
far less than on the CPU (the step is latency-bound), which is why the device backend accepts them there; this
table says what they cost where the work is compute-bound. Translations must be identical: a difference is an error.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..demo.numbers import held_out_pairs
from ..runtime.backends import DEVICE, INPLACE, open_backend
from ..runtime.counts import WorkCounts
from ..runtime.session import SessionOptions
from ..runtime.step_graph import StepOptions
from ..runtime.translator import DecodeOptions, Translator

BACKENDS = (INPLACE, DEVICE)


def _open(model: Path, backend: str, threads: int) -> tuple[Translator, object]:
    options = SessionOptions(intra_op_threads=threads, device="cpu")
    opened = open_backend(model, backend, options, step=StepOptions(fused=False))
    return Translator.of(opened), opened.backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="an fp32 model directory (tfm-export onnx)")
    parser.add_argument("--sentences", type=int, default=256, help="held-out sentences per cell")
    parser.add_argument("--batch-sizes", default="8,32,128")
    parser.add_argument("--beam-sizes", default="1,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    texts = [english for english, _ in held_out_pairs()[:args.sentences]]
    opened = {name: _open(args.model, name, args.threads) for name in BACKENDS}
    print(f"# Fixed shapes on the CPU: {args.model}, {len(texts)} held-out sentences, {args.threads} threads, "
          f"best of {args.rounds} interleaved rounds\n")
    print("| beam | batch | in-place sent/s | device sent/s | device / in-place | wasted row-steps |")
    print("|---:|---:|---:|---:|---:|---:|")
    for beam in map(int, args.beam_sizes.split(",")):
        for batch in map(int, args.batch_sizes.split(",")):
            options = DecodeOptions(beam_size=beam, batch_size=batch)
            best = dict.fromkeys(BACKENDS, float("inf"))
            outputs = {}
            device = opened[DEVICE][1]
            device.counts = WorkCounts()
            for _ in range(args.rounds):
                for name in BACKENDS:
                    translator = opened[name][0]
                    start = time.perf_counter()
                    outputs[name] = [t.text for t in translator.translate(texts, options)]
                    best[name] = min(best[name], time.perf_counter() - start)
            if outputs[DEVICE] != outputs[INPLACE]:
                raise SystemExit(f"beam {beam} batch {batch}: the device backend's translations differ")
            rate = {name: len(texts) / best[name] for name in BACKENDS}
            print(f"| {beam} | {batch} | {rate[INPLACE]:.1f} | {rate[DEVICE]:.1f} | "
                  f"{rate[DEVICE] / rate[INPLACE]:.2f} | {device.counts.finished_rows / device.counts.rows:.1%} |")


if __name__ == "__main__":
    main()
