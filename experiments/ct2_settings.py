"""One CTranslate2 setting timed on one 64-token sentence (batch 1) and a batch of 8, one intra thread, best of 2:
how the anchor's best CPU settings were chosen (docs/benchmarks-history.md). Settings that act through the
environment (CT2_USE_MKL, CT2_USE_EXPERIMENTAL_PACKED_GEMM, CT2_FORCE_CPU_ISA) are given to the process:

    for spec in float32 "float32 CT2_USE_MKL=1" int8 int8_float32 int16 "int8 CT2_FORCE_CPU_ISA=AVX2" ...; do
        set -- $spec; ct=$1; shift; env "$@" python experiments/ct2_settings.py build/bench/il/ctranslate2 $ct; done
"""

import os
import sys
import time

import ctranslate2

directory, compute_type = sys.argv[1], sys.argv[2]
tokens = [f"w{i}" for i in range(100, 118)]
translator = ctranslate2.Translator(directory, device="cpu", compute_type=compute_type, intra_threads=1,
                                    inter_threads=1)
translator.translate_batch([tokens], max_decoding_length=8, min_decoding_length=8)  # warm-up
best = []
for size in (1, 8):
    times = []
    for _ in range(2):
        start = time.perf_counter()
        translator.translate_batch([tokens] * size, max_decoding_length=64, min_decoding_length=64)
        times.append(time.perf_counter() - start)
    best.append(min(times))
settings = " ".join(f"{k}={v}" for k, v in os.environ.items() if k.startswith("CT2_"))
print(compute_type, settings, f"batch 1 {best[0]:.2f} s, batch 8 {best[1]:.2f} s", flush=True)
