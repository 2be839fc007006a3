"""The process-wide allocator setting tfm-run makes, checked against glibc itself in fresh processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import sys
import numpy as np
if sys.argv[1] == "set":
    from tfm_export.core.machine import return_large_blocks
    assert return_large_blocks()
big = np.ones(16 << 20, np.uint8)
del big  # glibc raises its mmap threshold to this block's size when it is freed
block = np.ones(4 << 20, np.uint8)
address = block.ctypes.data
for line in open("/proc/self/maps"):
    start, end = (int(x, 16) for x in line.split()[0].split("-"))
    if start <= address < end:
        print("heap" if line.rstrip().endswith("[heap]") else "mapped")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc/self/maps are Linux's")
@pytest.mark.parametrize("setting, where", [("default", "heap"), ("set", "mapped")])
def test_large_blocks_come_from_mmap_after_a_large_free(setting, where):
    """Without the setting a 4 MB block freed after a 16 MB one stays in the heap glibc rarely returns (the
    default's behaviour, checked so the test shows it matters); with it the block is its own mapping."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PROBE, setting], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == where


def test_the_cpu_kernel_key_names_the_architecture_and_only_kernel_features():
    import platform

    from tfm_export.core.machine import KERNEL_FEATURES, cpu_kernel_key
    key = cpu_kernel_key()
    assert key.startswith(platform.machine() + ";") and key == cpu_kernel_key()
    features = key.rsplit(";", 1)[1]
    assert set(filter(None, features.split(","))) <= KERNEL_FEATURES
