"""The GPU check's harness: its scale, checks and report, the log, and the children it runs (each step a process of
its own with a time limit), grouped in parts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "gpu_check.py"  # the entry: the children run it again
ROOT = SCRIPT.parents[1]
DEMO = ROOT / "models" / "demo"
CALIBRATION = ROOT / "calibration" / "demo.en.txt"
ORT_PARTS, ORT_TARGET = Path("/tmp/ortparts"), Path("/tmp/ortgpu")  # where device-ort-gpu.sh's calls put them
CARRIED_PARTS = ROOT / ".device-ort"  # where device-ort-gpu.sh writes them, and a carried piece arrives
WORK = Path("/tmp/tfm-gpu-check")  # the models made on the way: outside --out, which comes back whole
HIDDEN = ("sentencepiece", "num2words", "polygraphy", "ctranslate2", "tensorrt")  # not on the lent machine
NOT_INSTALLED = ("tfm_export", "tfm-export", "__editable__")  # nor is the package installed there: PYTHONPATH only
EXPORT = "from tfm_export.cli.entry import export_main; export_main()"
RUN = "from tfm_export.cli.entry import run_main; run_main()"
OK, FAILED, SKIPPED = "ok", "FAILED", "skipped"
MISS = " <injected miss>"


@dataclass(frozen=True)
class Scale:
    """How much each part does: the GPU run's sizes, or the rehearsal's smaller ones (the same steps)."""

    numbers: int  # held-out numbers translated per comparison
    generate_numbers: int  # per generate.onnx comparison: it decodes one input per call (at most `numbers`)
    calibration: int | None  # int8 calibration lines (None: the whole file)
    marian: dict[str, int]  # the speed part's model sizes (tfm_export.benchmarks.marian_shape's names)
    vocab: int
    cells: str  # tfm-run bench --cells
    output_length: int
    repeats: int
    min_time: float
    budgets: dict[str, float]  # seconds per part: what is left when one runs out is reported, not run


GPU_SCALE = Scale(1000, 200, None, dict(max_position_embeddings=512), 32000, "1x1,1x128,4x32", 64, 3, 1.0,
                  {"parity": 230, "speed": 290, "tensorrt": 120})
REHEARSAL_SCALE = Scale(100, 100, 32, dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                      decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                      max_position_embeddings=64), 1000, "1x1,1x8,2x4", 8, 2, 0.0,
                        {"parity": 900, "speed": 600, "tensorrt": 300})


class CheckError(Exception):
    """A step that cannot go on, in one line."""


@dataclass
class Check:
    part: str
    name: str
    status: str
    line: str
    seconds: float = 0.0


@dataclass
class Report:
    """Every check's one line, in order, and each part's time; summary.json is rewritten after each check."""

    out: Path
    incomplete: bool = False  # the CUDA parts could not run here (no onnxruntime-gpu, no usable GPU)
    checks: list[Check] = field(default_factory=list)
    parts_s: dict[str, float] = field(default_factory=dict)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        say(f"{check.status:<7} {check.part}: {check.line}")
        self.write()
        return check

    def write(self) -> None:
        data = {"checks": [asdict(c) for c in self.checks], "parts_s": self.parts_s, "status": self.status()}
        (self.out / "summary.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")

    def status(self) -> int:
        if any(c.status == FAILED for c in self.checks):
            return 1
        return 2 if self.incomplete else 0

    def summary(self) -> list[str]:
        times = ", ".join(f"{part} {s:.0f} s" for part, s in self.parts_s.items())
        lines = [f"== summary ({sum(self.parts_s.values()):.0f} s: {times})"]
        lines += [f"{c.status:<7} {c.part}: {c.line}" for c in self.checks]
        failed = [c for c in self.checks if c.status == FAILED]
        verdict = {0: "passed", 1: f"FAILED ({len(failed)} of {len(self.checks)} checks)",
                   2: "incomplete: the CUDA parts could not run here (see env)"}[self.status()]
        return lines + [f"result: {verdict}"]


LOG: list[Path] = []  # the run's log file, once --out is known


def say(line: str) -> None:
    print(line, flush=True)
    if LOG:
        with LOG[0].open("a", encoding="utf-8") as log:
            log.write(line + "\n")


@dataclass
class Environment:
    """What every child process runs with: this interpreter, PYTHONPATH (onnxruntime-gpu first, the rehearsal's
    sitecustomize, the repository root), and where the device side runs."""

    python: str
    paths: list[Path]
    extra: dict[str, str] = field(default_factory=dict)
    device: str = "cpu"
    rehearse: bool = False
    root: Path = ROOT  # the tree the children import tfm_export from and run in (the rehearsal's: a mirror of it)

    def variables(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TFM_THREADS")}
        env.update(PYTHONPATH=os.pathsep.join(map(str, [*self.paths, self.root])), PYTHONUNBUFFERED="1",
                   **self.extra)
        if self.rehearse:  # no venv commands: what is not run as `python -c` or `python -m` is not found
            bin_dir = str(Path(sys.executable).parent)
            env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != bin_dir)
        return env


def run_child(env: Environment, argv: Sequence[str], log: Path, timeout: float) -> tuple[int, list[str]]:
    """Run `argv` (after the interpreter) from the repository root, its output streamed to the console and `log`;
    (exit status, its last lines). A child past `timeout` is killed with its own children: status -9."""
    command = [env.python, *argv]
    lines: list[str] = []
    with log.open("w", encoding="utf-8") as out:
        child = subprocess.Popen(command, cwd=env.root, env=env.variables(), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)

        def copy() -> None:
            assert child.stdout is not None
            for line in child.stdout:
                out.write(line)
                lines.append(line.rstrip("\n"))
                print("    " + line.rstrip("\n"), flush=True)
        reader = threading.Thread(target=copy, daemon=True)
        reader.start()
        try:
            status = child.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, 9)
            child.wait()
            status = -9
        reader.join(timeout=10)
    return status, [line for line in lines if line.strip()][-20:]


def shown(argv: Sequence[str]) -> str:
    """A child's command as a person would type it (the wrappers as the commands they stand for)."""
    names = {EXPORT: "tfm-export", RUN: "tfm-run"}
    if len(argv) > 1 and argv[0] == "-c":
        argv = [names[argv[1]], *argv[2:]] if argv[1] in names else ["python3", "-c", "'...'", *argv[2:]]
    else:
        argv = ["python3", *argv]
    return " ".join(str(a).replace(str(ROOT) + "/", "") for a in argv)


class Part:
    """One part of the run: its steps share a time budget, and each step is one child process."""

    def __init__(self, name: str, report: Report, env: Environment, budget: float | None = None) -> None:
        self.name, self.report, self.env = name, report, env
        self.start, self.budget, self.steps = time.monotonic(), budget, 0

    def left(self) -> float:
        return float("inf") if self.budget is None else self.budget - (time.monotonic() - self.start)

    def step(self, name: str, argv: Sequence[str], needs: Sequence[Path] = (), timeout: float = 600,
             quiet: bool = False, joined: bool = False) -> Check:
        """Run one child and record it: ok on exit 0 (its last line says what it did, or all its lines joined;
        quiet: ok only in the log), FAILED otherwise with its last line; not run, FAILED, where what it needs was
        not made or the part's time is spent."""
        missing = [p for p in needs if not p.exists()]
        if missing:
            return self.report.add(Check(self.name, name, FAILED, f"{name}: not run, {missing[0].name} was not made"))
        if self.left() <= 0:
            return self.report.add(Check(self.name, name, FAILED,
                                         f"{name}: not run, the {self.name} part's {self.budget:.0f} s were spent"))
        self.steps += 1
        say(f"\n== [{self.name}] {shown(argv)}")
        log = self.report.out / "logs" / f"{self.name}-{self.steps:02d}.log"
        start = time.monotonic()
        status, lines = run_child(self.env, argv, log, min(timeout, self.left()))
        seconds = time.monotonic() - start
        last = lines[-1] if lines else "(no output)"
        if status == 0:
            found = SKIPPED if last.startswith("skipped: ") else OK  # a child that found its tool missing
            check = Check(self.name, name, found, " | ".join(lines) if joined else last, seconds)
            return check if quiet else self.report.add(check)
        why = "timed out" if status == -9 else f"exit {status}"
        line = last if last.startswith(name) and status != -9 else f"{name}: {why} after {seconds:.0f} s: {last}"
        return self.report.add(Check(self.name, name, FAILED, line, seconds))

    def done(self) -> None:
        self.report.parts_s[self.name] = time.monotonic() - self.start
        self.report.write()
