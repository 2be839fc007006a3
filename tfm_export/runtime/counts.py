"""What a backend did, counted only where someone asks: tests that count work and benchmarks that report it give a
backend a `WorkCounts` (`backend.counts = WorkCounts()`); without one nothing is counted."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkCounts:
    runs: int = 0          # decoder runs (generate.onnx: session runs)
    rows: int = 0          # rows computed, run by run
    finished_rows: int = 0  # of those, rows whose search had ended (the device backend's fixed shapes)
    rule_uploads: int = 0  # vocabulary-sized uploads of the decoding rules (the device backend)

    def run(self, rows: int = 0, finished: int = 0) -> None:
        self.runs, self.rows, self.finished_rows = self.runs + 1, self.rows + rows, self.finished_rows + finished
