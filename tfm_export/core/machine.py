"""Limits that follow from the machine the tool runs on, importable without any runtime library (the CLI
checks its options before PyTorch or ONNX Runtime loads)."""

from __future__ import annotations

import os

MAX_THREADS = 4 * (os.cpu_count() or 1)  # beyond this a thread pool only thrashes (or, for torch, crashes)
