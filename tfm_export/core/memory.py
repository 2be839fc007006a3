"""This process's resident memory, and the pages of a mapped file it can let go.

A large model's weights reach the process as mapped files: the checkpoint PyTorch reads, and the external data
file ONNX Runtime maps. Once a session has packed its weights into its own layout, or once PyTorch has computed
what was asked of it, the mapped pages are no longer read, yet they stay resident (and count in the process's
memory) until the kernel needs them. `release_file_pages` gives them back at once: a page of a file mapping that
was never written holds exactly the file's bytes, so dropping it loses nothing, and a later read (a Gather's rows,
an encoder that is not pre-packed) brings it back from the page cache. Linux only; elsewhere nothing is released.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

MADV_DONTNEED = 4  # linux/mman.h
SMAPS = Path("/proc/self/smaps")
MEMINFO = Path("/proc/meminfo")


def release_file_pages(paths: list[Path]) -> int:
    """Drop this process's resident pages of every mapping of these files that was never written (no dirty page);
    returns the bytes that were resident."""
    if not sys.platform.startswith("linux") or not SMAPS.exists():
        return 0
    wanted = {os.path.realpath(p) for p in paths}
    released = 0
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for start, end, rss in _clean_mappings(wanted):
        if madvise(start, end - start, MADV_DONTNEED) == 0:
            released += rss
    log.debug("released %d bytes of mapped pages of %s", released, ", ".join(sorted(wanted)))
    return released


def return_freed_heap() -> None:
    """Hand the C heap's freed memory back to the system (glibc's malloc_trim): a graph of gigabytes converted and
    let go otherwise leaves its pages in the process, and the next graph's peak starts from there."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None) if sys.platform.startswith("linux") else None
    if trim is not None:
        trim(0)


def _clean_mappings(files: set[str]) -> list[tuple[int, int, int]]:
    """(start, end, resident bytes) of each mapping of `files` whose pages were never written."""
    found, current = [], None
    for line in SMAPS.read_text().splitlines():
        fields = line.split(None, 5)
        if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            path = fields[5].strip() if len(fields) > 5 else ""
            current = {"range": (start, end), "file": path in files, "rss": 0, "dirty": 0}
            found.append(current)
        elif current is not None and fields[0] in ("Rss:", "Private_Dirty:", "Shared_Dirty:"):
            kilobytes = int(fields[1]) * 1024
            if fields[0] == "Rss:":
                current["rss"] = kilobytes
            else:
                current["dirty"] += kilobytes
    return [(*m["range"], m["rss"]) for m in found if m["file"] and m["dirty"] == 0]


def resident_bytes() -> int:
    """This process's resident memory now (VmRSS)."""
    return _status_kb("VmRSS:") * 1024


def peak_resident_bytes() -> int:
    """This process's peak resident memory so far (VmHWM)."""
    return _status_kb("VmHWM:") * 1024


def _status_kb(field: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def total_memory_bytes() -> int | None:
    """The machine's physical memory (MemTotal), or None where it cannot tell."""
    return _meminfo("MemTotal:")


def available_bytes() -> int | None:
    """Memory the system can give without swapping (MemAvailable), or None where it cannot tell."""
    return _meminfo("MemAvailable:")


def _meminfo(field: str) -> int | None:
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
