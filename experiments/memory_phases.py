"""Resident memory of one decode, phase by phase, for ONNX Runtime (a model directory) or CTranslate2 (a converted
model): after the imports, after loading, after decoding (RSS and its peak, VmHWM). `make bench` gives only each
backend's peak over all its cells; this says which phase the peak belongs to.

    python experiments/memory_phases.py ort build/bench/base/onnx-fp32 --batch 32 --beam 4 --length 128
    python experiments/memory_phases.py ct2 build/bench/base/ctranslate2 --batch 32 --beam 4 --length 128
    python experiments/memory_phases.py ort build/bench/base/onnx-fp32 --batch 32 --beam 4 --length 128 --trace

Run each in its own process (this script is one): peaks never go down.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from tfm_export.core.machine import return_large_blocks


def memory() -> str:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) // 1024
    return ", ".join(f"{k} {v} MB" for k, v in fields.items())


def peak_mb() -> int:
    return next(int(line.split()[1]) // 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmHWM"))


def trace_peaks(backend, decoding) -> None:
    """Print where the peak rises: after which call (a step, a reorder, a cache growth, the candidate search)."""
    last = [peak_mb()]

    def watched(owner, name: str) -> None:
        call = getattr(owner, name)

        def wrapper(*args, **kwargs):
            result = call(*args, **kwargs)
            if peak_mb() > last[0]:
                print(f"  peak {last[0]} -> {peak_mb()} MB in {name}")
                last[0] = peak_mb()
            return result
        setattr(owner, name, wrapper)
    for name in ("step", "reorder", "_grown", "_bind"):
        watched(backend, name)
    watched(decoding, "_top_candidates")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", choices=("ort", "ct2"))
    parser.add_argument("model", type=Path)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--length", type=int, default=64, help="tokens generated per sentence (forced)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compute-type", default="float32", help="CTranslate2's")
    parser.add_argument("--arena", action="store_true", help="ONNX Runtime with its CPU memory arena (tfm-run: off)")
    parser.add_argument("--trace", action="store_true", help="ONNX Runtime: print the calls in which the peak rises")
    args = parser.parse_args()
    return_large_blocks()  # as tfm-run and the benchmark workers do
    source = np.random.default_rng(0).integers(4, 32000, size=(args.batch, 24))
    if args.library == "ct2":
        import ctranslate2
        print(f"imported: {memory()}")
        translator = ctranslate2.Translator(str(args.model), device="cpu", compute_type=args.compute_type,
                                            intra_threads=args.threads, inter_threads=1)
        print(f"loaded: {memory()}")
        vocab = json.loads((args.model / "shared_vocabulary.json").read_text(encoding="utf-8"))
        tokens = [[vocab[i % len(vocab)] for i in row] for row in source]
        start = time.perf_counter()
        translator.translate_batch(tokens, beam_size=args.beam, max_decoding_length=args.length,
                                   min_decoding_length=args.length, max_batch_size=0)
    else:
        from tfm_export.runtime import decoding
        from tfm_export.runtime.backends import open_backend
        from tfm_export.runtime.session import SessionOptions
        print(f"imported: {memory()}")
        backend = open_backend(args.model, "onnxruntime", options=SessionOptions(
            intra_op_threads=args.threads, memory_arena=args.arena)).backend  # what tfm-run translate runs
        print(f"loaded: {memory()}")
        if args.trace:
            trace_peaks(backend, decoding)
        source = source % backend.config.src_vocab_size
        start = time.perf_counter()
        if args.beam > 1:
            decoding.beam_search(backend, source, args.beam, args.length, min_length=args.length)
        else:
            decoding.greedy(backend, source, args.length, min_length=args.length)
    print(f"decoded in {time.perf_counter() - start:.1f} s: {memory()}")


if __name__ == "__main__":
    main()
