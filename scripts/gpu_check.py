"""The GPU check: one call on a bare lent GPU machine, first what runs where, then parity with the CPU, then speed.

    python3 scripts/gpu_check.py --out $OUT                  # on the GPU machine, from the repository root
    python3 scripts/gpu_check.py --rehearse --out build/gpu-rehearsal    # here: the same steps on the CPU

What the lent machine has (docs/tensorrt.md): Python 3.12 with torch, transformers, onnx, onnxscript, a CPU
onnxruntime, tokenizers, click, tqdm and pytest; no venv, no network, no sentencepiece, num2words, polygraphy,
ctranslate2 or TensorRT. So this script installs nothing but onnxruntime-gpu, from the pieces an earlier call left
in /tmp/ortparts (../shared/tools/device-ort-gpu.sh), into /tmp/ortgpu, which it puts first on every child's
PYTHONPATH beside the repository root; it runs tfm-export and tfm-run as `python -c` wrappers of their entry points
and the rest as subcommands of this file, each in a process of its own with a time limit.

Parts, each timed, each check one line (each a module of scripts/gpu_parts/, beside the harness they share and the
children that run tfm_export):
- env: Python, PyTorch, ONNX Runtime (and where it was imported from), providers, the GPU, and a session made on
  CUDA without PyTorch imported (with LD_LIBRARY_PATH to the nvidia wheels where that alone fails);
- parity (about 4 minutes): the demo model exported, quantized to fp16 and int8 static, and wrapped as
  generate.onnx; the decoder step's node placement on the device; then the held-out numbers on the device
  against the CPU: fp32 greedy and beam 4 identical (the device backend, without and with CUDA graphs), fp16 and
  int8 at `tfm-export verify`'s floors, generate.onnx identical;
- speed (about 5 minutes): `tfm-run bench` on a random base-size Marian directory (made here without
  sentencepiece), greedy batch 1 and 128 and beam 4 batch 32, fp32 and fp16 with and without CUDA graphs, beside
  transformers' generate() fp16; its markdown and JSON land in --out;
- tensorrt: where TensorRT and a GPU it supports are installed (not on the lent machines), the demo's fp16
  engines against the CPU at verify's fp16 floor; elsewhere one line saying what is missing.

--rehearse runs the same steps on the CPU execution provider, in the interpreter that runs this script but with
what the lent machine lacks hidden (a sitecustomize that swaps site-packages for a copy without them) and no venv
commands on PATH, at a smaller scale (a few minutes): the "device" side is the device backend on the CPU, compared
with the CPU's in-place backend, so a miss is still a real one. --inject-miss changes one line of one device-side
output, to prove a miss fails the run.

Exit status: 0 no check failed (what this machine lacks, TensorRT say, is a "skipped" line); 1 a check failed
(the summary says which, one line each); 2 nothing failed but the CUDA parts could not run here (no
onnxruntime-gpu, no usable GPU). --only reruns a few checks, --fresh makes every model again (they are kept in
--work between runs on the same machine). Everything is in --out: gpu_check.log, summary.json (rewritten after
every check, so a run cut short still says how far it got), each step's log, the translations compared, the
bench's markdown and JSON.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from gpu_parts.children import CHILDREN, child_parser
from gpu_parts.engines import tensorrt_part
from gpu_parts.env import env_part
from gpu_parts.harness import (
    FAILED,
    GPU_SCALE,
    LOG,
    REHEARSAL_SCALE,
    SKIPPED,
    WORK,
    Check,
    Environment,
    Report,
    Scale,
    say,
)
from gpu_parts.parity import parity_part
from gpu_parts.speed import speed_part


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] in CHILDREN:
        args = child_parser().parse_args(argv)
        return CHILDREN[args.command](args)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="reports, logs and bench files (the device's $OUT)")
    parser.add_argument("--work", type=Path, default=WORK,
                        help="models made on the way, kept for a rerun on the same machine unless --fresh (default "
                        "%(default)s: large files, kept out of --out)")
    parser.add_argument("--rehearse", action="store_true", help="the same steps on this CPU machine, smaller")
    parser.add_argument("--numbers", type=int, default=None, help="held-out numbers per comparison (default: "
                        f"{GPU_SCALE.numbers}, generate.onnx {GPU_SCALE.generate_numbers}; rehearsal "
                        f"{REHEARSAL_SCALE.numbers})")
    parser.add_argument("--budgets", default="", help="seconds per part, as parity=230,speed=290,tensorrt=120 (the "
                        "defaults on a GPU): a step still running then is stopped, and the part's later steps are "
                        "not run (each a FAILED line)")
    parser.add_argument("--parts", default="parity,speed,tensorrt", help="which of parity, speed and tensorrt run "
                        "after env, in this order")
    parser.add_argument("--only", default="", help="comma-separated: only the parity checks whose names hold one of "
                        "these (placement, fp32 beam 4, CUDA graphs, int8, ...) and the references they need")
    parser.add_argument("--fresh", action="store_true", help="make every model again, even where --work has it")
    parser.add_argument("--inject-miss", action="store_true", help="change one device-side translation: must fail")
    args = parser.parse_args(argv)
    scale = REHEARSAL_SCALE if args.rehearse else GPU_SCALE
    if args.numbers:
        scale = Scale(**{**asdict(scale), "numbers": args.numbers})
    if args.budgets:
        given = dict(item.split("=") for item in args.budgets.split(","))
        scale = Scale(**{**asdict(scale), "budgets": {**scale.budgets, **{k: float(v) for k, v in given.items()}}})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    work = args.work.resolve()
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    LOG[:] = [args.out / "gpu_check.log"]
    LOG[0].write_text("", encoding="utf-8")
    report = Report(args.out)
    say(f"gpu_check{' --rehearse' if args.rehearse else ''}: {platform.node()}, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
    env = Environment(sys.executable, [], rehearse=args.rehearse)
    usable = env_part(report, env, work)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    report.incomplete = not usable and not args.rehearse  # the rehearsal's CPU session must work: else it failed
    for name in parts:
        if not usable:
            report.add(Check(name, name, SKIPPED if report.incomplete else FAILED, f"{name}: not run, no "
                             f"{'CPU' if args.rehearse else 'CUDA'} session could be made here (see env)"))
        elif name == "parity":
            parity_part(report, env, work, scale, args.inject_miss, [o.strip() for o in args.only.split(",") if o])
        elif name == "speed":
            speed_part(report, env, work, scale)
        elif name == "tensorrt":
            tensorrt_part(report, env, work, scale)
        else:
            report.add(Check(name, name, FAILED, f"unknown part {name!r}; use parity, speed and/or tensorrt"))
    say("")
    for line in report.summary():
        say(line)
    return report.status()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
