"""ONNX Runtime's weight-MatMul floor of one batch-1 greedy step against CTranslate2's whole greedy step on the
same weights (docs/benchmarks.md, "Decoding speed at NLLB-1.3B's shape": why the fp32 greedy batch-1 cell stays
short). First the floor's rounds (bench.kernel_floor: the step's MatMuls as one graph, best of 40 runs, threads
spinning and sleeping, the lower kept), then CTranslate2's, each in a fresh process: the per-token difference of
best-of-3 forced decodes of 65 and 1 tokens.

    python experiments/step_floor_vs_ct2.py --checkpoint build/scale/nllb-1.3b/ckpt.pt \
        --ct2 build/scale/nllb-1.3b-ct2 --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tfm_export.bench.kernel_floor import _save_graph, best_run_ms, step_matmuls
from tfm_export.model.loading import load_checkpoint
from tfm_export.runtime.session import SessionOptions

SENTENCE = "w11 w203 w3000 w47 w9 w1200 w77 w5 w600 w34 w18 w2500"  # the seed-shaped models' random vocabulary
CT2_STEP = r"""
import sys, time, ctranslate2
t = ctranslate2.Translator(sys.argv[1], compute_type="float32", intra_threads=int(sys.argv[2]))
src = [sys.argv[3].split()]
best = []
for n in (1, 65):
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        t.translate_batch(src, beam_size=1, max_decoding_length=n, min_decoding_length=n)
        runs.append(time.perf_counter() - start)
    best.append(min(runs))
print((best[1] - best[0]) / 64 * 1e3)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="the seed-format checkpoint")
    parser.add_argument("--ct2", type=Path, required=True, help="its CTranslate2 conversion")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    shapes = step_matmuls(load_checkpoint(args.checkpoint).model)
    gc.collect()
    print(f"{len(shapes)} MatMuls, {sum(i * o for i, o in shapes) * 4 / 1e9:.2f} GB of weights", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step_matmuls.onnx"
        _save_graph(shapes, path)
        feeds = {f"x{width}": np.ones((1, width), np.float32) for width in {i for i, _ in shapes}}
        for r in range(args.rounds):
            floor = min(best_run_ms(path, feeds, SessionOptions(intra_op_threads=args.threads, spinning=spinning))
                        for spinning in (True, False))
            print(f"round {r + 1}: ONNX Runtime MatMul floor {floor:.1f} ms", flush=True)
    for r in range(args.rounds):
        out = subprocess.run([sys.executable, "-c", CT2_STEP, str(args.ct2), str(args.threads), SENTENCE],
                             capture_output=True, text=True, check=True).stdout
        print(f"round {r + 1}: CTranslate2 greedy step {float(out.strip().splitlines()[-1]):.1f} ms", flush=True)


if __name__ == "__main__":
    main()
