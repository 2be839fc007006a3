"""Where decoding time goes, for docs/benchmarks.md: ONNX Runtime's per-operator profile of one decoder
step, and a cProfile of the Python search loop around the sessions.

    python scripts/profile_decode.py --model build/bench/base-work/onnx-fp32 --batch 32 --beam 4
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import pstats
import random
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tfm_export.core.batching import pad_batch
from tfm_export.runtime import decoding
from tfm_export.runtime.ort_backend import OrtBackend


def sources(count: int, vocab: int, seed: int = 0) -> np.ndarray:
    rng = random.Random(seed)
    return pad_batch([[2, *(rng.randrange(4, vocab) for _ in range(rng.randint(12, 24))), 3] for _ in range(count)])


def operator_profile(model: Path, rows: int, past: int, steps: int = 20) -> None:
    """Kernel time per operator type for decoder_step at `rows` rows and `past` cached tokens."""
    backend = OrtBackend.open(model)
    state = backend.encode(sources(rows, backend.config.src_vocab_size))
    for _ in range(past):
        state, _ = backend.step(state, np.full(rows, 5))
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.enable_profiling, options.profile_file_prefix = True, f"{tmp}/step"
        session = ort.InferenceSession(str(model / "decoder_step.onnx"), options, providers=["CPUExecutionProvider"])
        feeds = {"input_ids": np.full((rows, 1), 5, np.int64), "encoder_attention_mask": state.mask,
                 **dict(zip(backend.self_input_names, state.past, strict=True)),
                 **dict(zip(backend.cross_input_names, state.cross, strict=True))}
        for _ in range(steps):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    by_op, by_node = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"] / steps / 1000
            by_node[e["name"][:-len("_kernel_time")]] += e["dur"] / steps / 1000
    total = sum(by_op.values())
    print(f"decoder_step, {rows} rows, past {past}: {total:.2f} ms of kernel time per step")
    for op, ms in by_op.most_common(6):
        print(f"  {op:28} {ms:7.2f} ms  {100 * ms / total:5.1f}%")
    print("  slowest nodes: " + ", ".join(f"{n} {ms:.2f} ms" for n, ms in by_node.most_common(3)))


def loop_profile(model: Path, batch: int, beam: int, length: int) -> None:
    """cProfile of one whole forced-length decode: session time against the Python around it."""
    backend = OrtBackend.open(model)
    src = sources(batch, backend.config.src_vocab_size)
    run = (lambda: decoding.greedy(backend, src, length, length)) if beam == 1 else \
        (lambda: decoding.beam_search(backend, src, beam, length, min_length=length))
    run()  # warm-up
    profile = cProfile.Profile()
    profile.runcall(run)
    print(f"\ndecode of batch {batch}, beam {beam}, {length} tokens:")
    pstats.Stats(profile).sort_stats("tottime").print_stats(8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--past", type=int, default=32)
    args = parser.parse_args()
    operator_profile(args.model, 1, args.past)
    operator_profile(args.model, args.batch * args.beam, args.past)
    loop_profile(args.model, args.batch, args.beam, args.length)


if __name__ == "__main__":
    main()
