"""Limits that follow from the machine the tool runs on, importable without any runtime library (the CLI
checks its options before PyTorch or ONNX Runtime loads)."""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from pathlib import Path

MAX_THREADS = 4 * (os.cpu_count() or 1)  # beyond this a thread pool only thrashes (or, for torch, crashes)
HASH_THREADS = min(4, os.cpu_count() or 1)  # files hashed at once when a directory opens (sha256 is CPU-bound)

LARGE_BLOCK_BYTES = 1 << 20  # blocks at least this large come from mmap and go back to the system when freed
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def return_large_blocks() -> bool:
    """Fix glibc's mmap threshold (unless MALLOC_MMAP_THRESHOLD_ already does). By default glibc raises it to
    the size of the first large block freed (up to 32 MB), so later cache buffers and logits come from a heap
    that it rarely hands back: ~75 MB more peak RSS for beam 4 x 32 on the base config. Process-wide, so only
    processes we own call it (tfm-run, benchmark workers); False where the C library has no mallopt."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES))
    except (OSError, AttributeError):
        return False


# The CPU features ONNX Runtime's kernels (MLAS) choose their code and their pre-packed weight layouts by, on x86
# and Arm; a feature outside this list changes no kernel, so a VM that gains or hides one keeps its key.
KERNEL_FEATURES = frozenset({
    "sse3", "ssse3", "sse4_1", "sse4_2", "avx", "f16c", "fma", "avx2", "bmi2", "avx512f", "avx512bw", "avx512dq",
    "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "avx_vnni_int8", "amx_tile", "amx_int8",
    "amx_bf16", "amx_fp16", "asimd", "asimddp", "asimdhp", "i8mm", "bf16", "sve", "sve2", "sme"})


@functools.cache
def cpu_kernel_key() -> str:
    """What a CPU-specific artefact (ONNX Runtime's pre-packed weights) depends on in this machine: architecture,
    vendor, family and model, and the kernel-relevant instruction sets. Two machines with the same key pack weights
    alike; a different key means the artefact is not used until it is made again."""
    import platform  # only a load that looks for pre-packed graphs asks, once
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key in ("vendor_id", "cpu family", "model", "flags", "Features", "CPU implementer", "CPU part"):
                fields.setdefault(key, value)
    except OSError:  # not Linux: what the platform module says
        fields["processor"] = platform.processor()
    features = set((fields.pop("flags", "") + " " + fields.pop("Features", "")).split()) & KERNEL_FEATURES
    described = [platform.machine(), *(f"{k}={v}" for k, v in sorted(fields.items()))]
    return ";".join([*described, ",".join(sorted(features))])
