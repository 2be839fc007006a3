"""Shared by the C++ example's tests: the translator built as `make cpp` builds it (scripts/build_cpp.py), run
over lines, and its n-best read back; its ids and scores held to tfm-run's (the Python Translator)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from support.common import REPO
from tfm_export import Translator
from tfm_export.runtime.translator import DecodeOptions

BUILD_SCRIPT = REPO / "scripts" / "build_cpp.py"
PACKAGES_UNAVAILABLE = 3  # build_cpp.py's exit status where Debian's packages cannot be fetched
SCORE_TOLERANCE = 1e-4


@cache
def _build() -> tuple[Path | None, str]:
    done = subprocess.run([sys.executable, str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1200)
    if done.returncode == PACKAGES_UNAVAILABLE:
        return None, done.stderr.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout + done.stderr
    return Path(done.stdout.splitlines()[-1]), ""  # `make cpp` prints the binary's path last


def built_translator() -> Path:
    """The C++ translator, built once per test process (cached in build/, and a file lock keeps two workers from
    building at once); skipped, saying why, only where Debian's packages cannot be fetched (no apt, no
    network)."""
    if not shutil.which("cmake") or not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("cmake and a C++17 compiler are needed")
    binary, why = _build()
    if binary is None:
        pytest.skip(why)
    assert binary.is_file()
    return binary


def run_cpp(binary: Path, model: Path, lines: list[str], *options: str) -> list[str]:
    """The translator over `lines` on stdin, one thread (the tests' workers share the cores): its output lines.
    Stdin is a file, so its chunks (and so its batches) do not depend on when a pipe's writes arrive."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as stdin:
        stdin.write("\n".join(lines) + "\n")
        stdin.seek(0)
        done = subprocess.run([str(binary), str(model), "--threads", "1", *options], stdin=stdin,
                              capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


def cpp_nbest(binary: Path, model: Path, sources: list[list[int]], beam: int, n_best: int, *options: str
              ) -> list[list[tuple[tuple[int, ...], float | None, float]]]:
    """--ids --format jsonl: per source its n_best (ids, score, log-probability), best first; with one
    hypothesis, its score is not printed (None)."""
    out = run_cpp(binary, model, [" ".join(map(str, s)) for s in sources], "--ids", "--beam-size", str(beam),
                  "--n-best", str(n_best), "--format", "jsonl", *options)
    rows = [json.loads(line) for line in out]
    assert len(rows) == len(sources)
    return [[(tuple(int(t) for t in e["translation"].split()), e["score"], e["log_prob"]) for e in row["n_best"]]
            if n_best > 1 else [(tuple(row["ids"]), None, row["score"])] for row in rows]


def assert_same_ids_and_scores(binary: Path, model: Path, sources: list[list[int]], max_length: int) -> None:
    """Greedy, and beam 4 with the 3 best at length penalty 0.6, one source per batch in both (ONNX Runtime may
    round a batch of one differently from a padded batch): identical ids, and scores and log-probabilities within
    SCORE_TOLERANCE."""
    translator = Translator.load(model)
    for beam, n_best, penalty in ((1, 1, 1.0), (4, 3, 0.6)):
        options = DecodeOptions(beam_size=beam, n_best=n_best, length_penalty=penalty, max_length=max_length,
                                batch_size=1)
        want = translator.translate_ids(sources, options)
        got = cpp_nbest(binary, model, sources, beam, n_best, "--length-penalty", str(penalty),
                        "--max-length", str(max_length), "--batch-size", "1")
        for source, hypotheses, found in zip(sources, want, got, strict=True):
            assert [ids for ids, _, _ in found] == [h.tokens for h in hypotheses], (beam, source)
            np.testing.assert_allclose([p for _, _, p in found], [h.score for h in hypotheses], atol=SCORE_TOLERANCE)
            if n_best > 1:  # one hypothesis has no score printed: jsonl gives its log-probability
                np.testing.assert_allclose([s for _, s, _ in found], [h.normalized_score for h in hypotheses],
                                           atol=SCORE_TOLERANCE)
