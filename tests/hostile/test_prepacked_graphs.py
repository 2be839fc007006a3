"""The pre-packed graphs (.tfm-cache) made hostile: stamps that are a pipe or an endless device, entries that leave a
loaded file unlisted, and a .tfm-cache that is a link, a file or immutable when `tfm-export prepack` replaces it.
A translation must come out as the model's own (the tiny model's reference), and a refused prepack must leave the
directory exactly as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tfm_export.runtime.prepacked_graphs import DATA, ENTRY, PREPACKED_DIR, STAMPS

from .scratch import Case
from .support import TINY_SENT, assert_fix_named, assert_ok, same_output

STEP = "decoder_step_search_fused"  # the tiny model's pre-packed decoder


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink()
    os.symlink("/dev/zero", path)


STAMPS_CASES = {"fifo": _fifo, "dev-zero": _dev_zero}


@pytest.mark.parametrize("kind", STAMPS_CASES)
def test_stamps_that_never_end(case: Case, kind: str) -> None:
    """A stamps.json that is a FIFO (its read would wait for a writer) or a link to /dev/zero (endless): ignored,
    every file hashed, the translation the model's own."""
    m = case.copy_model(case.fx.tiny())
    STAMPS_CASES[kind](m / PREPACKED_DIR / STAMPS)
    r = case.run("tfm-run", "translate", "--model", m, TINY_SENT, timeout=120)
    assert_ok(r, same_output(case.fx.tiny_ref()))


def _unlisted_data(slot: Path) -> None:
    """The entry's record of its data file dropped, and the data file zeroed."""
    entry = json.loads((slot / ENTRY).read_text())
    del entry["files"][DATA]
    (slot / ENTRY).write_text(json.dumps(entry))
    data = slot / DATA
    data.write_bytes(bytes(data.stat().st_size))


def _stray_folder(slot: Path) -> None:
    """A folder the entry does not list, holding a copy of the data (ONNX Runtime resolves external data below the
    graph's folder)."""
    (slot / "sub").mkdir()
    shutil.copyfile(slot / DATA, slot / "sub" / DATA)


ENTRY_CASES = {"unlisted-data": _unlisted_data, "stray-folder": _stray_folder}


@pytest.mark.parametrize("kind", ENTRY_CASES)
def test_entry_with_files_it_does_not_list(case: Case, kind: str) -> None:
    m = case.copy_model(case.fx.tiny())
    ENTRY_CASES[kind](m / PREPACKED_DIR / STEP)
    assert_ok(case.run("tfm-run", "translate", "--model", m, TINY_SENT), same_output(case.fx.tiny_ref()))


PREPACK_CASES = ("symlink", "file", "immutable")


@pytest.mark.parametrize("kind", PREPACK_CASES)
def test_prepack_over_a_cache_it_cannot_replace(case: Case, kind: str) -> None:
    """Refused in one line saying what is there; the directory as it was, no .tfm-cache.old.* or staging left."""
    m = case.copy_model(case.fx.tiny())
    cache = m / PREPACKED_DIR
    if kind == "symlink":
        outside = case.p("outside-cache")
        shutil.move(cache, outside)
        case.input(outside)
        os.symlink(outside, cache)
    elif kind == "file":
        shutil.rmtree(cache)
        cache.write_text("not a folder\n")
    elif subprocess.run(["chattr", "+i", cache], capture_output=True).returncode:
        pytest.skip("chattr +i not permitted here")
    try:
        r = case.run("tfm-export", "prepack", "--model", m)
    finally:
        if kind == "immutable":
            subprocess.run(["chattr", "-i", cache], capture_output=True)
    words = {"symlink": "is a symbolic link", "file": "is a file", "immutable": "nothing was changed"}[kind]
    assert_fix_named(r, words)
