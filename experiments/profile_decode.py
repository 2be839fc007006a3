"""Where decoding time goes (docs/benchmarks-history.md): ONNX Runtime's per-operator profile of the CPU decoder step
(decoder_step_search, as tfm-run translate runs it), and a cProfile of the Python search loop around the sessions,
at batch 1 greedy and at --batch x --beam.

    python experiments/profile_decode.py --model build/bench/base/onnx-fp32 --batch 32 --beam 4
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
from tfm_export.core.token_rules import SEED_RULES
from tfm_export.runtime import decoding
from tfm_export.runtime.backends import INPLACE, open_backend
from tfm_export.runtime.backends.loaders import open_graph
from tfm_export.runtime.step import StepRule
from tfm_export.runtime.step_graph import SEARCH, StepOptions


def sources(count: int, vocab: int, seed: int = 0) -> np.ndarray:
    rng = random.Random(seed)
    return pad_batch([[2, *(rng.randrange(4, vocab) for _ in range(rng.randint(12, 24))), 3] for _ in range(count)])


def _backend(model: Path, profile_prefix: str | None = None):
    """What tfm-run translate runs on the CPU (the encoder and decoder_step_search sharing the tied table, opened
    through the runtime's door), the sessions' kernels profiled if a prefix is given."""
    def profiled(path, spec, options, so):
        so = so or ort.SessionOptions()
        if profile_prefix:
            so.enable_profiling, so.profile_file_prefix = True, f"{profile_prefix}-{path.stem}"
        return open_graph(path, spec, options, so)
    return open_backend(model, INPLACE, loader=profiled, step=StepOptions(fused=False)).backend


def operator_profile(model: Path, batch: int, beam: int, steps: int) -> None:
    """Kernel time per operator type of the CPU decoder step (_backend), averaged over `steps` steps of `batch` sources
    with `beam` rows each (grouped as beam search groups them)."""
    with tempfile.TemporaryDirectory() as tmp:
        backend = _backend(model, f"{tmp}/step")
        state = backend.encode(sources(batch, backend.config.src_vocab_size))
        state = backend.expand(state, beam)
        for _ in range(steps):
            state, _ = backend.step(state, np.full(batch * beam, 5), StepRule(SEED_RULES, 2 * beam))
        events = json.loads(Path(backend.decoder.end_profiling()).read_text())
    by_op, by_node = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"] / steps / 1000
            by_node[e["name"][:-len("_kernel_time")]] += e["dur"] / steps / 1000
    total = sum(by_op.values())
    print(f"{SEARCH.value}, {batch} x {beam} rows, steps 1-{steps}: {total:.2f} ms of kernel time per step")
    for op, ms in by_op.most_common(6):
        print(f"  {op:28} {ms:7.2f} ms  {100 * ms / total:5.1f}%")
    print("  slowest nodes: " + ", ".join(f"{n} {ms:.2f} ms" for n, ms in by_node.most_common(3)))


def loop_profile(model: Path, batch: int, beam: int, length: int) -> None:
    """cProfile of one whole forced-length decode: session time against the Python around it."""
    backend = _backend(model)
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
    args = parser.parse_args()
    operator_profile(args.model, 1, 1, args.length)
    operator_profile(args.model, args.batch, args.beam, args.length)
    loop_profile(args.model, 1, 1, args.length)
    loop_profile(args.model, args.batch, args.beam, args.length)


if __name__ == "__main__":
    main()
