"""Limits that follow from the machine the tool runs on, importable without any runtime library (the CLI
checks its options before PyTorch or ONNX Runtime loads)."""

from __future__ import annotations

import ctypes
import os
import sys

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
