"""The least any Python decoding loop around decoder_step_search can take per step: write the step's token and
length into the bound arrays, run the session, read the best id. No beam bookkeeping, no cache growth (the steps
stay within one capacity block): every greedy or beam search does at least this much, so where a cell's allowed
step (docs/benchmarks.md) is shorter, no search loop in Python meets it.

    python experiments/loop_floor.py --model build/bench/demo/onnx-fp32 --rows 1,4,8
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from tfm_export.core.token_rules import SEED_RULES
from tfm_export.core.tokenizer import FIRST_TOKEN_ID
from tfm_export.runtime.backends import INPLACE, open_backend
from tfm_export.runtime.backends.inplace import InPlaceBackend
from tfm_export.runtime.session import SessionOptions
from tfm_export.runtime.step import StepRule
from tfm_export.runtime.step_graph import CAPACITY_STEP, StepOptions


def loop_ms(backend: InPlaceBackend, rows: int, source_length: int, repeats: int) -> list[float]:
    """Per repeat, the mean time of the minimal step over one capacity block of cache positions."""
    src = np.random.default_rng(0).integers(FIRST_TOKEN_ID, backend.config.src_vocab_size, (rows, source_length))
    times = []
    for _ in range(repeats):
        state, tokens = backend.encode(src), np.full(rows, SEED_RULES.start)
        state, _ = backend.step(state, tokens, StepRule(SEED_RULES, 1))  # binds the buffers, capacity CAPACITY_STEP
        buffers = state.buffers
        start = time.perf_counter()
        for filled in range(1, CAPACITY_STEP - 1):
            buffers.ids[:, 0] = tokens
            buffers.length[...] = filled
            backend.decoder.run_with_iobinding(buffers.binding)
            tokens = buffers.top[1][:, 0]
        times.append((time.perf_counter() - start) / (CAPACITY_STEP - 2) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="an fp32 directory with decoder_step_search")
    parser.add_argument("--rows", default="1,4,8", help="decoder rows (batch x beam), comma-separated")
    parser.add_argument("--source-length", type=int, default=14)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    for threads in (1, 2):
        options = SessionOptions(intra_op_threads=threads)
        backend = open_backend(args.model, INPLACE, options, step=StepOptions(fused=False)).backend
        for rows in map(int, args.rows.split(",")):
            times = loop_ms(backend, rows, args.source_length, args.repeats)
            print(f"{rows} rows, {threads} thread(s): best {min(times):.3f} ms/step, "
                  f"median {statistics.median(times):.3f}")


if __name__ == "__main__":
    main()
