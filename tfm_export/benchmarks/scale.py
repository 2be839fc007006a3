"""Large models through every stage beside CTranslate2, for `make bench-scale`: wall time and peak memory per stage,
and the size on disk, each stage in a fresh process and the two tools' stages interleaved round by round.

Models (made once in --work-dir, random weights, real shapes):
  nllb-600m       the seed architecture at NLLB-200 600M's shape: d_model 1024, 16 heads, 12+12 layers, FFN 4096,
                  vocabulary 256,000 (615M parameters, 2.46 GB)
  nllb-1.3b       the same at NLLB-200 1.3B's: 24+24 layers, FFN 8192 (1.37B parameters, 5.5 GB)
  nllb-3.3b       NLLB-200 3.3B's: d_model 2048, 24+24 layers, FFN 8192 (3.3B parameters, 13.4 GB)
  m2m100-1.3b     transformers' M2M100 at NLLB-1.3B's shape, sharded safetensors (benchmarks.m2m100_shape)

Stages, ours: `tfm-export onnx` (parity checked), `tfm-export verify` (against PyTorch), `tfm-export quantize
--precision int8 --mode dynamic`, the first translation with `tfm-run translate` (fp32 and int8: start, load,
one sentence of 64 tokens); CTranslate2's: its converter (spec API, as `tfm-run bench` converts) and its first
translation (float32 and int8, the same 64 tokens). Peak memory is the process's maximum resident set (wait4's
ru_maxrss), on a page cache warmed by the round before (the first round is the cold one, and is reported apart).

    python -m tfm_export.benchmarks.scale --work-dir build/scale --models nllb-600m,nllb-1.3b --rounds 2 \\
        --json build/scale/scale.json > build/scale/scale.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
SEED_SHAPES = {  # random-checkpoint flags
    "nllb-600m": ["--d-model", "1024", "--heads", "16", "--layers", "12", "--ffn", "4096", "--vocab-size", "256000"],
    "nllb-1.3b": ["--d-model", "1024", "--heads", "16", "--layers", "24", "--ffn", "8192", "--vocab-size", "256000"],
    "nllb-3.3b": ["--d-model", "2048", "--heads", "16", "--layers", "24", "--ffn", "8192", "--vocab-size", "256000"],
}
HF_SHAPES = {"m2m100-1.3b": []}  # benchmarks.m2m100_shape's defaults
SENTENCE = "w11 w203 w3000 w47 w9 w1200 w77 w5 w600 w34 w18 w2500"  # the seed-shaped models' random vocabulary
HF_SENTENCE = "the model translates every line of the input"
HF_TARGET = "__fr__"
LENGTH = 64  # tokens each tool generates for the sentence (random weights never end it): the same decode for both
CT2_CONVERT = """
import sys
from pathlib import Path
from tfm_export.bench.ctranslate2 import convert_to_ctranslate2
from tfm_export.model.loading import load_checkpoint
convert_to_ctranslate2(load_checkpoint(Path(sys.argv[1])), Path(sys.argv[2]))
"""
CT2_TRANSLATE = """
import sys, ctranslate2
translator = ctranslate2.Translator(sys.argv[1], compute_type=sys.argv[2], intra_threads=int(sys.argv[3]))
print(translator.translate_batch([sys.argv[4].split()], max_decoding_length=int(sys.argv[5]))[0].hypotheses[0])
"""


@dataclass
class Stage:
    model: str
    tool: str  # "tfm-export" or "ctranslate2"
    name: str  # "convert", "verify", "int8", "translate fp32", ...
    round: int
    seconds: float
    peak_mb: float
    ok: bool
    detail: str = ""


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, bool, str]:
    """Wall seconds, peak resident MB (the child's ru_maxrss), success and the last line of its output."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **(env or {})})
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    lines = [line for line in output.splitlines() if line.strip()]
    return seconds, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status) == 0, lines[-1] if lines else ""


def make_model(name: str, work: Path) -> Path:
    """The model's checkpoint (file or Hugging Face directory), made once."""
    if name in SEED_SHAPES:
        directory = work / name
        if not (directory / "ckpt.pt").is_file():
            subprocess.run([str(BIN / "tfm-export"), "random-checkpoint", "--output", str(directory), "--force",
                            *SEED_SHAPES[name]], check=True)
        return directory / "ckpt.pt"
    directory = work / name
    if not (directory / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "tfm_export.benchmarks.m2m100_shape", "--output", str(directory)],
                       check=True)
    return directory


def size_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 2 ** 20
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2 ** 20


def weights_mb(checkpoint: Path) -> float:
    files = [checkpoint] if checkpoint.is_file() else [p for p in checkpoint.iterdir() if p.suffix == ".safetensors"]
    return sum(p.stat().st_size for p in files) / 2 ** 20


STAGES = ("convert", "verify", "int8", "translate fp32", "translate int8")


def run_round(name: str, checkpoint: Path, work: Path, number: int, threads: int,
              wanted: tuple[str, ...] = STAGES) -> list[Stage]:
    """One round of every stage, ours and CTranslate2's alternating (which goes first alternates by round)."""
    onnx, int8, ct2 = work / f"{name}-onnx", work / f"{name}-int8", work / f"{name}-ct2"
    sentence = HF_SENTENCE if checkpoint.is_dir() else SENTENCE
    target = ["--target-lang", HF_TARGET] if checkpoint.is_dir() else []  # M2M100 names no default language
    ours = [("convert", [str(BIN / "tfm-export"), "onnx", "--checkpoint", str(checkpoint), "--output", str(onnx),
                         "--force"]),
            ("verify", [str(BIN / "tfm-export"), "verify", "--model", str(onnx), "--checkpoint", str(checkpoint),
                        "--samples", "2", "--steps", "4", "--beam-size", "2"]),
            ("int8", [str(BIN / "tfm-export"), "quantize", "--model", str(onnx), "--precision", "int8", "--mode",
                      "dynamic", "--output", str(int8), "--force"]),
            ("translate fp32", [str(BIN / "tfm-run"), "translate", "--model", str(onnx), "--threads", str(threads),
                                "--max-length", str(LENGTH), *target, sentence]),
            ("translate int8", [str(BIN / "tfm-run"), "translate", "--model", str(int8), "--threads", str(threads),
                                "--max-length", str(LENGTH), *target, sentence])]
    theirs = [("convert", [sys.executable, "-c", CT2_CONVERT, str(checkpoint), str(ct2)]),
              ("translate fp32", [sys.executable, "-c", CT2_TRANSLATE, str(ct2), "float32", str(threads), sentence,
                                  str(LENGTH)]),
              ("translate int8", [sys.executable, "-c", CT2_TRANSLATE, str(ct2), "int8", str(threads), sentence,
                                  str(LENGTH)])]
    stages = []
    for stage in [s for s in STAGES if s in wanted]:
        runs = [("tfm-export", dict(ours)[stage])] + ([("ctranslate2", dict(theirs)[stage])] if stage in dict(theirs)
                                                      else [])
        for tool, argv in (runs if number % 2 == 0 else runs[::-1]):
            seconds, peak, ok, detail = timed(argv)
            stages.append(Stage(name, tool, stage, number, round(seconds, 1), round(peak), ok, detail[:160]))
            print(f"[scale] {name} {tool} {stage} round {number}: {seconds:.1f} s, {peak:.0f} MB, "
                  f"{'ok' if ok else 'FAILED: ' + detail}", file=sys.stderr, flush=True)
    return stages


def report(stages: list[Stage], sizes: dict[str, dict[str, float]]) -> str:
    """Per model and stage: ours and CTranslate2's best (warm) seconds and peak MB, and their ratios."""
    lines = ["| model | stage | tfm-export s | MB | CTranslate2 s | MB | time ratio | memory ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for model in dict.fromkeys(s.model for s in stages):
        for stage in dict.fromkeys(s.name for s in stages if s.model == model):
            best = {}
            for tool in ("tfm-export", "ctranslate2"):
                runs = [s for s in stages if (s.model, s.name, s.tool) == (model, stage, tool) and s.ok]
                warm = [s for s in runs if s.round > 0] or runs
                best[tool] = (min(s.seconds for s in warm), min(s.peak_mb for s in warm)) if warm else None
            ours, theirs = best["tfm-export"], best["ctranslate2"]
            cells = [f"{ours[0]:.1f}", f"{ours[1]:.0f}"] if ours else ["failed", ""]
            cells += [f"{theirs[0]:.1f}", f"{theirs[1]:.0f}"] if theirs else ["", ""]
            ratio = [f"{ours[0] / theirs[0]:.2f}x", f"{ours[1] / theirs[1]:.2f}x"] if ours and theirs else ["", ""]
            lines.append(f"| {model} | {stage} | " + " | ".join(cells + ratio) + " |")
    lines += ["", "| model | weights MB | ours: onnx MB | of which .tfm-cache | int8 MB | CTranslate2 MB |",
              "|---|---|---|---|---|---|"]
    for model, size in sizes.items():
        lines.append(f"| {model} | {size['weights']:.0f} | {size['onnx']:.0f} | {size['cache']:.0f} | "
                     f"{size['int8']:.0f} | {size['ct2']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--models", default="nllb-600m,nllb-1.3b,m2m100-1.3b")
    parser.add_argument("--rounds", type=int, default=2, help="the first is on a cold page cache")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--stages", default=",".join(STAGES),
                        help="comma-separated, of: " + ", ".join(STAGES) + " (a later one needs the earlier's output)")
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    wanted = tuple(args.stages.split(","))
    if set(wanted) - set(STAGES):
        parser.error(f"--stages: unknown {sorted(set(wanted) - set(STAGES))}; choose from {', '.join(STAGES)}")
    stages, sizes = [], {}
    for name in args.models.split(","):
        if name not in SEED_SHAPES and name not in HF_SHAPES:
            parser.error(f"--models: unknown {name!r}; choose from {', '.join([*SEED_SHAPES, *HF_SHAPES])}")
        checkpoint = make_model(name, args.work_dir)
        for number in range(args.rounds):
            if number == 0 and shutil.which("sync"):
                subprocess.run(["sync"], check=False)
                try:  # a cold page cache for the first round, where this machine lets us (root)
                    Path("/proc/sys/vm/drop_caches").write_text("3\n")
                except OSError:
                    pass
            stages += run_round(name, checkpoint, args.work_dir, number, args.threads, wanted)
        onnx = args.work_dir / f"{name}-onnx"
        sizes[name] = {"weights": weights_mb(checkpoint), "onnx": size_mb(onnx),
                       "cache": size_mb(onnx / ".tfm-cache") if (onnx / ".tfm-cache").exists() else 0.0,
                       "int8": size_mb(args.work_dir / f"{name}-int8"), "ct2": size_mb(args.work_dir / f"{name}-ct2")}
        args.json.write_text(json.dumps({"stages": [asdict(s) for s in stages], "sizes": sizes}, indent=1))
    print(report(stages, sizes))


if __name__ == "__main__":
    main()
