"""What many tests share: where the repository and its demo model are, the tiny config, and file-system helpers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from tfm_export.core.batching import pad_batch
from tfm_export.core.config import ModelConfig
from tfm_export.core.tokenizer import BOS_ID, EOS_ID, FIRST_TOKEN_ID

REPO = Path(__file__).resolve().parents[2]
DEMO_CKPT = REPO / "models" / "demo" / "ckpt.pt"
CALIBRATION = REPO / "calibration" / "demo.en.txt"
T = TypeVar("T")


def tiny_config(**overrides) -> ModelConfig:
    base = dict(src_vocab_size=13, trg_vocab_size=13, d_model=16, d_inner=32, n_layers=2, n_head=2, d_k=8,
                d_v=8, n_position=32)
    base.update(overrides)
    return ModelConfig(**base)


def listing(directory: Path) -> list[str]:
    """Every path under a directory, to show that a failed command wrote nothing."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


@contextlib.contextmanager
def unwritable_dir(path: Path):
    """A directory nobody may write into, root included (immutable flag), else by permissions."""
    path.mkdir(parents=True, exist_ok=True)
    immutable = subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    if not immutable:
        path.chmod(0o500)
    try:
        probe = path / ".probe"
        try:
            probe.touch()
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip("cannot make a directory unwritable here (root without chattr)")
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            path.chmod(0o700)


def within(seconds: float, work: Callable[[], T]) -> T:
    """work() in a daemon thread, failing the test if it has not returned in time: a read that blocks for ever (a
    FIFO with no writer) fails one test instead of hanging the suite."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s (blocked?)"
    if "error" in box:
        raise box["error"]
    return box["value"]


def made_once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """A directory made once per test run and shared by the xdist workers: the first to ask makes it, the others
    wait for it. Base-size models take a minute or more each to export and quantize."""
    from filelock import FileLock
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # this run's own directory, above each worker's
    path, made = shared / name, shared / f"{name}.made"
    with FileLock(f"{path}.lock"):
        if not made.exists():
            shutil.rmtree(path, ignore_errors=True)
            make(path)
            made.touch()
    return path


def short_sources(vocab: int, count: int, seed: int) -> np.ndarray:
    """`count` padded sources of 1 to 8 random ordinary tokens between <s> and </s>."""
    rng = np.random.default_rng(seed)
    rows = [[BOS_ID, *rng.integers(FIRST_TOKEN_ID, vocab, rng.integers(1, 9)).tolist(), EOS_ID] for _ in range(count)]
    return pad_batch(rows)


HEAVY = {"torch", "onnx", "onnxruntime", "onnxscript", "polygraphy", "tensorrt", "ctranslate2", "transformers"}


def modules_after(code: str) -> set[str]:
    """Which heavy modules a fresh interpreter has loaded after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in " \
            f"{sorted(HEAVY)!r})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    return {m.split(".")[0] for m in json.loads(out.stdout.strip().splitlines()[-1])}


def npm_example(tmp_path_factory, example: Path) -> Path:
    """A copy of examples/<example> with its npm packages from the committed lockfile (node and npm, or a skip).
    onnxruntime-node's install script would fetch CUDA binaries from a host out of reach: skipped."""
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node and npm are not installed")
    work = tmp_path_factory.mktemp(example.name) / "example"
    shutil.copytree(example, work, ignore=shutil.ignore_patterns("node_modules"))
    result = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=work, capture_output=True, text=True,
                            timeout=600, env={**os.environ, "ONNXRUNTIME_NODE_INSTALL_CUDA": "skip"})
    assert result.returncode == 0, result.stderr[-2000:]
    return work
