"""The GPU check: one call on a bare lent GPU machine, first what runs where, then parity with the CPU, then speed.

    python3 scripts/gpu_check.py --out $OUT                  # on the GPU machine, from the repository root
    python3 scripts/gpu_check.py --rehearse --out build/gpu-rehearsal    # here: the same steps on the CPU

What the lent machine has (docs/tensorrt.md): Python 3.12 with torch, transformers, onnx, onnxscript, a CPU
onnxruntime, tokenizers, click, tqdm and pytest; no venv, no network, no sentencepiece, num2words, polygraphy,
ctranslate2 or TensorRT. So this script installs nothing but onnxruntime-gpu, from the pieces an earlier call left
in /tmp/ortparts (../shared/tools/device-ort-gpu.sh), into /tmp/ortgpu, which it puts first on every child's
PYTHONPATH beside the repository root; it runs tfm-export and tfm-run as `python -c` wrappers of their entry points
and the rest as subcommands of this file, each in a process of its own with a time limit.

Parts, each timed, each check one line:
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
import importlib.util
import json
import os
import platform
import shutil
import site
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCRIPT = Path(__file__).resolve()
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


# --- the children's environment ---------------------------------------------------------------------------------

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


# --- env: what runs where --------------------------------------------------------------------------------------

def wheel_name(wheel: Path) -> str:
    """The file name pip needs for a wheel, read from the wheel itself (its .dist-info/WHEEL tags): pieces of a
    wheel arrive without it."""
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise CheckError(f"the pieces joined ({wheel.stat().st_size / 1e6:.0f} MB) are not a whole wheel: send every "
                         "piece of one download") from None
    with archive:
        found = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/WHEEL")]
        if not found:
            raise CheckError(f"{wheel}: not a wheel (no .dist-info/WHEEL inside)")
        tags = [line.split(":", 1)[1].strip().split("-") for line in archive.read(found[0]).decode().splitlines()
                if line.startswith("Tag:")]
    if not tags:
        raise CheckError(f"{wheel}: its WHEEL file names no tags")
    name_version = found[0].split("/")[0].removesuffix(".dist-info")
    joined = [".".join(dict.fromkeys(tag[i] for tag in tags)) for i in range(3)]
    return f"{name_version}-{'-'.join(joined)}.whl"


def install_pieces(folders: Sequence[Path], target: Path, python: str) -> str:
    """The wheel whose pieces (part00, part01, ...) are in `folders` (each name taken from the first folder that has
    it), joined and installed into `target` with pip (no index, no dependencies); what was installed, in one line."""
    found: dict[str, Path] = {}
    for folder in folders:
        for piece in sorted(folder.glob("part*")):
            found.setdefault(piece.name, piece)
    pieces = [found[name] for name in sorted(found)]
    if not pieces:
        raise CheckError(f"no pieces in {', '.join(map(str, folders))}")
    if sorted(found) != [f"part{n:02d}" for n in range(len(found))]:
        raise CheckError(f"the pieces are {', '.join(sorted(found))}: one is missing; send every piece")
    joined = target.parent / f"{target.name}-joined.whl"
    with joined.open("wb") as out:
        for piece in pieces:
            out.write(piece.read_bytes())
    wheel = joined.rename(joined.with_name(wheel_name(joined)))
    done = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--upgrade",
                           "--target", str(target), str(wheel)], capture_output=True, text=True)
    if done.returncode:
        raise CheckError(f"pip could not install {wheel.name}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return f"{wheel.name} ({len(pieces)} pieces, {wheel.stat().st_size / 1e6:.0f} MB) installed into {target}"


def probe_wheel(directory: Path) -> Path:
    """A one-module wheel, for the rehearsal to send through install_pieces as the GPU run sends onnxruntime-gpu."""
    import base64
    import hashlib
    files = {"tfm_probe/__init__.py": b"INSTALLED = True\n",
             "tfm_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tfm-probe\nVersion: 1.0\n",
             "tfm_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: gpu_check\nRoot-Is-Purelib: true\n"
                                              b"Tag: py3-none-any\n"}
    record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
              f"{len(data)}" for name, data in files.items()]
    files["tfm_probe-1.0.dist-info/RECORD"] = ("\n".join(record) + "\ntfm_probe-1.0.dist-info/RECORD,,\n").encode()
    wheel = directory / "probe.zip"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def split(wheel: Path, parts: Path, size: int) -> None:
    parts.mkdir(parents=True, exist_ok=True)
    data = wheel.read_bytes()
    for n, start in enumerate(range(0, len(data), size)):
        (parts / f"part{n:02d}").write_bytes(data[start:start + size])


def onnxruntime_gpu(report: Report, env: Environment, work: Path) -> bool:
    """Put onnxruntime-gpu first on the children's path: installed already, or installed now from its pieces.
    The rehearsal sends a probe wheel through the same steps (split, joined, named, installed) instead."""
    if env.rehearse:
        parts, target = work / "rehearse" / "ortparts", work / "rehearse" / "ortgpu"
        shutil.rmtree(parts, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        split(probe_wheel(work / "rehearse"), parts, 300)
        line = install_pieces([parts], target, env.python)
        found = subprocess.run([env.python, "-c", "import tfm_probe; print(tfm_probe.__file__)"], capture_output=True,
                               text=True, env={**os.environ, "PYTHONPATH": str(target)})
        if not found.stdout.startswith(str(target)):
            raise CheckError(f"the probe wheel was installed but does not import from {target}")
        report.add(Check("env", "wheel pieces", OK, f"rehearsal: a probe wheel's pieces joined, named and {line}"))
        return False
    if (ORT_TARGET / "onnxruntime").is_dir():
        line = f"onnxruntime-gpu already in {ORT_TARGET}"
    elif any(list(folder.glob("part*")) for folder in (ORT_PARTS, CARRIED_PARTS)):
        line = install_pieces([ORT_PARTS, CARRIED_PARTS], ORT_TARGET, env.python)
    else:
        report.add(Check("env", "onnxruntime-gpu", SKIPPED, f"onnxruntime-gpu: not in {ORT_TARGET} and no pieces in "
                         f"{ORT_PARTS} or {CARRIED_PARTS} (send them first: ../shared/tools/device-ort-gpu.sh); the "
                         "CUDA parts are skipped"))
        return False
    env.paths.insert(0, ORT_TARGET)
    report.add(Check("env", "onnxruntime-gpu", OK, line))
    return True


def hide_packages(env: Environment, work: Path) -> str:
    """The rehearsal's Python as the lent machine's: every site-packages folder swapped (by a sitecustomize on
    PYTHONPATH, in every child and the children they spawn) for a folder of links to everything in it but the
    packages the lent machine lacks and tfm-export's own install."""
    root = work / "rehearse"
    shutil.rmtree(root / "site", ignore_errors=True)
    swaps, hidden = {}, set()
    for n, real in enumerate(site.getsitepackages()):
        if not Path(real).is_dir():
            continue
        mirror = root / "site" / f"packages{n}"
        mirror.mkdir(parents=True)
        for entry in Path(real).iterdir():
            name = entry.name.lower()
            if any(name == h or name.startswith((f"{h}-", f"{h}.", f"{h}_")) for h in (*HIDDEN, *NOT_INSTALLED)):
                hidden.add(name.split("-")[0].split(".")[0])
                continue
            (mirror / entry.name).symlink_to(entry)
        swaps[real] = str(mirror)
        swaps[os.path.realpath(real)] = str(mirror)
    env.root = mirror_tree(root / "tree")
    (root / "site" / "sitecustomize.py").write_text(
        '"""gpu_check --rehearse: site-packages without what the lent GPU machine lacks."""\nimport sys\n'
        f"SWAPS = {swaps!r}\nsys.path[:] = [SWAPS.get(p, p) for p in sys.path]\n", encoding="utf-8")
    env.paths.append(root / "site")
    return ", ".join(sorted(hidden)) or "nothing (none of them is installed here)"


def mirror_tree(mirror: Path) -> Path:
    """The repository as the lent machine receives it (tracked and unignored files): links to its entries, without
    the package metadata an editable install leaves in the root (tfm_export.egg-info), which would make the
    children's tfm_export an installed package, with its extras' requirements checked, where there it is not."""
    shutil.rmtree(mirror, ignore_errors=True)
    mirror.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if not entry.name.endswith(".egg-info"):
            (mirror / entry.name).symlink_to(entry)
    return mirror


VERSIONS = r"""
import importlib.util, platform, sys
from pathlib import Path
import onnxruntime as ort, torch
from importlib import metadata
root, rehearse, hidden = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3].split(",")
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"
print(f"python {platform.python_version()} ({sys.executable})")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible to PyTorch"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}): {gpu}")
print(f"onnxruntime {ort.__version__} from {Path(ort.__file__).parent}: {', '.join(ort.get_available_providers())}")
print(", ".join(f"{n} {version(n)}" for n in ("transformers", "onnx", "onnxscript", "tokenizers", "click", "numpy")))
import tfm_export
print(f"tfm_export from {Path(tfm_export.__file__).resolve().parent}")
present = [n for n in hidden if importlib.util.find_spec(n) is not None]
print(f"absent: {', '.join(n for n in hidden if n not in present) or 'none'}; present: {', '.join(present) or 'none'}")
if not Path(tfm_export.__file__).resolve().is_relative_to(root):
    sys.exit(f"tfm_export is imported from {tfm_export.__file__}, not from {root}")
if rehearse and present:
    sys.exit(f"the rehearsal still sees {', '.join(present)}, which the lent machine lacks")
"""


def nvidia_libraries() -> list[str]:
    """The lib folders of the nvidia-* wheels (cuBLAS, cuDNN, ...), where ONNX Runtime may not look by itself."""
    spec = importlib.util.find_spec("nvidia")
    tops = list(spec.submodule_search_locations or []) if spec else []
    return [str(lib) for top in tops for lib in sorted(Path(top).glob("*/lib")) if lib.is_dir()]


def env_part(report: Report, env: Environment, work: Path) -> bool:
    """What runs where, said first; True where the device side can run (CUDA, or the rehearsal's CPU)."""
    part = Part("env", report, env)
    if env.rehearse:
        report.add(Check("env", "rehearsal", OK, f"rehearsal on the CPU; hidden from the children: "
                         f"{hide_packages(env, work)}; no venv commands on PATH"))
    try:
        has_ort = onnxruntime_gpu(report, env, work)
    except CheckError as exc:
        report.add(Check("env", "onnxruntime-gpu", FAILED, f"onnxruntime-gpu: {exc}"))
        has_ort = False
    smi = shutil.which("nvidia-smi")
    gpu = "no nvidia-smi here"
    if smi:
        query = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True)
        gpu = query.stdout.strip() or query.stderr.strip()
    report.add(Check("env", "GPU", OK, f"GPU (nvidia-smi): {gpu}"))
    versions = part.step("versions", ["-c", VERSIONS, str(ROOT), str(int(env.rehearse)), ",".join(HIDDEN)],
                         timeout=120, joined=True)
    usable = versions.status == OK and (env.rehearse or has_ort)
    if usable:
        usable = cuda_session(part, env)
    part.done()
    return usable


def cuda_session(part: Part, env: Environment) -> bool:
    """A session on the device side's provider, made as tfm-run makes them (strict: no silent CPU fallback),
    without PyTorch imported; where CUDA fails, once more with LD_LIBRARY_PATH naming the nvidia wheels."""
    env.device = "cpu" if env.rehearse else "cuda"
    argv = [SCRIPT, "probe", "--device", env.device]
    if part.step("session", argv, timeout=120).status == OK:
        return True
    libraries = nvidia_libraries()
    if env.rehearse or not libraries:
        return False
    env.extra["LD_LIBRARY_PATH"] = os.pathsep.join([*libraries, os.environ.get("LD_LIBRARY_PATH", "")])
    return part.step("session with LD_LIBRARY_PATH", argv, timeout=120).status == OK


# --- parity ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Comparison:
    """One device-side translation of the numbers and the CPU reference it must equal (or meet the floor of)."""

    name: str
    model: str  # demo directory: fp32, fp16, int8, generate
    beam: int
    floor: str = "exact"  # or the precision whose verify floor (graphs.parity.MIN_AGREEMENT) it must meet
    graphs: bool = False

    @property
    def reference(self) -> str:
        return f"cpu {'generate' if self.model == 'generate' else 'fp32'} beam {self.beam}"


def comparisons(device: str, rehearse: bool) -> list[Comparison]:
    side = f"{device} device backend" if rehearse else device
    found = [Comparison(f"fp32 beam {beam}, {side}{', CUDA graphs' if graphs else ''}", "fp32", beam, graphs=graphs)
             for graphs in (False, True) for beam in (1, 4)]
    found += [Comparison(f"fp16 beam {beam}, {side}", "fp16", beam, "fp16") for beam in (1, 4)]
    found += [Comparison(f"int8 beam 1, {device}", "int8", 1, "int8")]
    return found + [Comparison(f"generate beam {beam}, {device}", "generate", beam) for beam in (1, 4)]


def parity_part(report: Report, env: Environment, work: Path, scale: Scale, inject: bool,
                only: Sequence[str] = ()) -> None:
    """The demo model's directories, where its step runs, and the held-out numbers on the device against the CPU;
    only: the checks whose names hold one of these (and the models and references they need)."""
    part = Part("parity", report, env, scale.budgets["parity"])
    chosen = lambda name: not only or any(o in name for o in only)  # noqa: E731
    checks = [c for c in comparisons(env.device, env.rehearse) if chosen(c.name)]
    placements = [name for name in ("fp32", "fp16", "int8") if chosen(f"placement {name}")]
    demo = {name: work / f"demo-{name}" for name in ("fp32", "fp16", "int8", "generate")}
    needed = {"fp32", *placements, *(c.model for c in checks)}
    make_demo(part, demo, [name for name in demo if name in needed], work, scale)
    # the device side is tfm-run's default on CUDA: the device backend where the directory has decoder_step_search
    # (fp32, fp16), the contract's decoder_step where not (int8 static); the rehearsal asks for the same on the CPU
    device = env.device
    rehearsal = {name: ["--backend", "onnxruntime-device"] if env.rehearse and name in ("fp32", "fp16") else []
                 for name in demo}
    for name in placements:
        part.step(f"placement {name}", [SCRIPT, "placement", "--model", demo[name], "--device", device,
                                        *rehearsal[name], "--label", f"{name} on {device}:"],
                  [demo[name] / "manifest.json"], timeout=120)
    numbers = {"loop": held_out(work, scale.numbers), "generate": held_out(work, min(scale.generate_numbers,
                                                                                      scale.numbers))}
    outputs = report.out / "parity"
    outputs.mkdir(exist_ok=True)
    file = lambda name: outputs / (name.replace(", ", "-").replace(" ", "-") + ".txt")  # noqa: E731

    def translate(name: str, model: str, beam: int, device: str, *options: str | Path) -> None:
        backend = ["--backend", "onnxruntime-generate"] if model == "generate" else []
        part.step(name, [SCRIPT, "translate", "--model", demo[model], "--device", device, "--beam", str(beam),
                         "--input", numbers["generate" if backend else "loop"], "--output", file(name),
                         "--label", name, *backend, *options],
                  [demo[model] / "manifest.json", *[o for o in options if isinstance(o, Path)]], timeout=180,
                  quiet=not options)

    for reference in dict.fromkeys(c.reference for c in checks):  # the CPU's own backends: in place, generate.onnx
        model, beam = reference.split()[1], int(reference.split()[-1])
        translate(reference, model, beam, "cpu")
    for n, check in enumerate(checks):
        options = [] if check.model == "generate" else [*rehearsal[check.model], *(["--cuda-graphs"] * check.graphs)]
        translate(check.name, check.model, check.beam, device, *options, "--against", file(check.reference),
                  "--reference", check.reference, "--floor", check.floor, *(["--perturb"] * (inject and n == 0)))
    part.done()


def held_out(work: Path, count: int) -> Path:
    """The first `count` held-out numbers, in a file of their own."""
    numbers = work / f"heldout-{count}.en.txt"
    lines = (DEMO / "heldout.en.txt").read_text(encoding="utf-8").splitlines()[:count]
    numbers.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return numbers


def make_demo(part: Part, demo: dict[str, Path], names: Sequence[str], work: Path, scale: Scale) -> None:
    """The demo model's directories that `names` asks for and --work lacks: fp32 exported, fp16 and int8 static
    (calibrated) quantized from it, generate.onnx written beside it."""
    calibration = CALIBRATION
    if scale.calibration:
        calibration = work / "calibration.txt"
        lines = CALIBRATION.read_text(encoding="utf-8").splitlines()[:scale.calibration]
        calibration.write_text("\n".join(lines) + "\n", encoding="utf-8")
    builds = {"fp32": ["onnx", "--checkpoint", DEMO / "ckpt.pt"],
              "fp16": ["quantize", "--model", demo["fp32"], "--precision", "fp16"],
              "int8": ["quantize", "--model", demo["fp32"], "--precision", "int8", "--calibration", calibration],
              "generate": ["generate", "--model", demo["fp32"]]}
    for name in names:
        if (demo[name] / "manifest.json").exists():
            say(f"kept {demo[name]} (made by an earlier run; --fresh makes it again)")
            continue
        needs = [demo["fp32"] / "manifest.json"] if name != "fp32" else []
        part.step(f"demo {name}", ["-c", EXPORT, *builds[name], "--output", demo[name], "--force"], needs,
                  timeout=240)


# --- speed -------------------------------------------------------------------------------------------------------

def speed_part(report: Report, env: Environment, work: Path, scale: Scale) -> None:
    part = Part("speed", report, env, scale.budgets["speed"])
    marian = work / ("small-marian" if env.rehearse else "base-marian")
    if not (marian / "config.json").exists():
        part.step("random Marian directory", [SCRIPT, "marian", "--output", marian, "--vocab-size",
                                              str(scale.vocab), "--sizes", json.dumps(scale.marian)], timeout=120)
    backends = ["ort-fp32", "ort-fp32-graphs", "ort-fp16", "ort-fp16-graphs", "hf-generate-fp16"]
    if env.rehearse:
        backends.insert(-1, "hf-generate")  # fp16 generate() is for GPUs: the rehearsal times the fp32 one
    bench_json, bench_md = report.out / "bench.json", report.out / "bench.md"
    bench_json.unlink(missing_ok=True)
    part.step("bench", ["-c", RUN, "bench", "--device", env.device, "--model", marian, "--work-dir", work / "bench",
                        "--backends", ",".join(backends), "--cells", scale.cells, "--output-length",
                        str(scale.output_length), "--repeats", str(scale.repeats), "--min-time", str(scale.min_time),
                        "--json", bench_json, "--markdown", bench_md], [marian / "config.json"], timeout=600)
    if bench_json.exists():
        for check in bench_checks(json.loads(bench_json.read_text(encoding="utf-8")), env.device):
            report.add(check)
    part.done()


def bench_checks(data: dict, device: str) -> list[Check]:
    """The bench's verdicts, one line each: every backend that can run on this device ran; the CUDA-graph
    backend decodes as the one it captures; tokens/s per cell, with the ratio to generate()."""
    backends = data["backends"]
    anchor = "hf-generate-fp16" if device == "cuda" else "hf-generate"
    anchor_rows = {(r["beam"], r["batch"]): r["tokens_per_s"] for r in backends.get(anchor, {}).get("rows", [])}
    checks = []
    for name, result in backends.items():
        if result["skipped"]:
            gpu_only = device == "cpu" and "time it with --device cuda" in result["skipped"]
            checks.append(Check("speed", name, SKIPPED if gpu_only else FAILED, f"{name}: {result['skipped']}"))
            continue
        cells = []
        for row in result["rows"]:
            anchor_rate = anchor_rows.get((row["beam"], row["batch"]))
            ratio = f" ({row['tokens_per_s'] / anchor_rate:.2f}x)" if anchor_rate and name != anchor else ""
            cells.append(f"beam {row['beam']} batch {row['batch']} {row['tokens_per_s']:,.0f}{ratio}")
        agreement = result.get("agreement")
        exact = name != "ort-fp32-graphs" or agreement == 1.0
        line = f"{name} tok/s: {'; '.join(cells)}; agreement with ort-fp32 {agreement}"
        if not exact:
            line += " (the captured steps must decode as ort-fp32)"
        checks.append(Check("speed", name, OK if exact else FAILED, line))
    for cell, ms in data.get("step_floor_ms", {}).items():
        say(f"step floor, {cell}: {ms:.3f} ms")
    return checks


# --- tensorrt ----------------------------------------------------------------------------------------------------

def tensorrt_part(report: Report, env: Environment, work: Path, scale: Scale) -> None:
    """Where TensorRT and a GPU it supports are here (not on the lent machines): the demo's fp16 engines against
    the CPU, at verify's fp16 floor; elsewhere one line saying what is missing."""
    part = Part("tensorrt", report, env, scale.budgets["tensorrt"])
    fp32 = work / "demo-fp32"
    make_demo(part, {"fp32": fp32}, ["fp32"], work, scale)
    numbers = held_out(work, scale.numbers)
    part.step("tensorrt", [SCRIPT, "tensorrt", "--model", fp32, "--output", work / "engines-fp16", "--input", numbers],
              [fp32 / "manifest.json"], timeout=300)
    part.done()


# --- the children ------------------------------------------------------------------------------------------------

def child_translate(args: argparse.Namespace) -> int:
    """Translate the numbers as tfm-run does (Translator.load with the session options its flags make); with
    --against, compare line by line and pass when identical (exact) or at verify's floor for the precision."""
    from tfm_export.runtime.session import SessionOptions
    from tfm_export.runtime.translator import DecodeOptions, Translator
    lines = args.input.read_text(encoding="utf-8").splitlines()
    options = SessionOptions(device=args.device, cuda_graphs=args.cuda_graphs)
    start = time.perf_counter()
    translator = Translator.load(args.model, (), args.backend, options)
    got = [t.text for t in translator.translate(lines, DecodeOptions(beam_size=args.beam))]
    seconds = time.perf_counter() - start
    if args.perturb:
        got[-1] += MISS
    args.output.write_text("\n".join(got) + "\n", encoding="utf-8")
    if args.against is None:
        print(f"{args.label}: {len(got)} translations in {seconds:.1f} s")
        return 0
    want = args.against.read_text(encoding="utf-8").splitlines()
    return verdict(args.label, got, want, args.reference, args.floor, seconds)


def verdict(label: str, got: list[str], want: list[str], reference: str, floor: str, seconds: float) -> int:
    """Print how many translations equal the reference's and whether that passes: all of them (floor "exact") or
    verify's share for the precision (graphs.parity.MIN_AGREEMENT); exit status 0 or 1."""
    from tfm_export.graphs.parity import MIN_AGREEMENT
    same = sum(g == w for g, w in zip(got, want, strict=True))
    share = 1.0 if floor == "exact" else MIN_AGREEMENT[floor]
    passed = same == len(want) if floor == "exact" else same / len(want) >= share
    rule = "all required" if floor == "exact" else f"floor {100 * share:.1f}%"
    line = f"{label}: {same}/{len(want)} identical to {reference} ({rule}), {seconds:.1f} s"
    if not passed:
        first = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
        line += f"; line {first + 1}: {got[first]!r} where the reference has {want[first]!r}"
    print(line)
    return 0 if passed else 1


def child_placement(args: argparse.Namespace) -> int:
    from tfm_export.bench.placement import step_placement
    from tfm_export.runtime.session import SessionOptions
    print(f"{args.label} {step_placement(args.model, SessionOptions(device=args.device), args.backend).line}")
    return 0


def child_probe(args: argparse.Namespace) -> int:
    """One Add on the device, in a session made as tfm-run makes its own (onnxruntime.preload_dlls, providers
    checked after the session is built), with no PyTorch imported: the CUDA libraries found by ONNX Runtime alone."""
    import tempfile

    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from tfm_export.core.errors import TfmExportError
    from tfm_export.runtime.session import SessionOptions, open_session
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "probe", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.onnx"
        onnx.save(model, path)
        try:
            session = open_session(path, SessionOptions(device=args.device))
        except TfmExportError as exc:
            print(f"no {args.device} session: {exc}")
            return 1
        result = session.run(None, {"x": np.ones(2, np.float32)})[0]
    if "torch" in sys.modules or result.tolist() != [2.0, 2.0]:
        print("the probe imported PyTorch or computed a wrong sum")
        return 1
    libraries = " (LD_LIBRARY_PATH: the nvidia wheels)" if "nvidia" in os.environ.get("LD_LIBRARY_PATH", "") else ""
    print(f"a {args.device} session without PyTorch runs on {', '.join(session.get_providers())}{libraries}")
    return 0


def child_marian(args: argparse.Namespace) -> int:
    """A random Marian directory (tfm_export.benchmarks.marian_shape's model) with a tokenizers-only tokenizer.json:
    words w2 ... of a WordLevel vocabulary, </s> 0 framing sources as MarianTokenizer does, <pad> last."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from tfm_export.benchmarks.marian_shape import random_marian
    size = args.vocab_size
    vocab = {"</s>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, size - 1)}, "<pad>": size - 1}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["</s>", "<unk>", "<pad>"])
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 0)])
    args.output.mkdir(parents=True, exist_ok=True)
    random_marian(args.output, size, size - 1, **json.loads(args.sizes))
    tokenizer.save(str(args.output / "tokenizer.json"))
    print(f"wrote {args.output}: a random Marian model, vocabulary {size}, {args.sizes}")
    return 0


def child_tensorrt(args: argparse.Namespace) -> int:
    """fp16 TensorRT engines of the demo model built here and the numbers translated with them, greedy, against the
    CPU's fp32 at verify's fp16 floor; "skipped: why" where TensorRT or a GPU it supports is missing."""
    from tfm_export.runtime.tensorrt_platform import missing_reason
    why = missing_reason()
    if why:
        print(f"skipped: TensorRT engines not built or run: {why}")
        return 0
    from tfm_export.runtime.translator import Translator
    from tfm_export.trt.build import build_engines
    lines = args.input.read_text(encoding="utf-8").splitlines()
    want = [t.text for t in Translator.load(args.model).translate(lines)]
    start = time.perf_counter()
    build_engines(args.model, args.output, "fp16", force=True, progress=False)
    built = time.perf_counter() - start
    start = time.perf_counter()
    got = [t.text for t in Translator.load(args.output).translate(lines)]
    return verdict(f"TensorRT fp16 engines (built in {built:.0f} s), greedy", got, want, "the CPU's fp32", "fp16",
                   time.perf_counter() - start)


CHILDREN: dict[str, Callable[[argparse.Namespace], int]] = {
    "translate": child_translate, "placement": child_placement, "probe": child_probe, "marian": child_marian,
    "tensorrt": child_tensorrt}


def child_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu_check.py", description="one step of the GPU check, in its own process")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("translate", "placement"):
        command = commands.add_parser(name)
        command.add_argument("--model", type=Path, required=True)
        command.add_argument("--device", default="cpu")
        command.add_argument("--backend", default="onnxruntime")
        command.add_argument("--label", default="")
    translate = commands.choices["translate"]
    translate.add_argument("--cuda-graphs", action="store_true")
    translate.add_argument("--beam", type=int, default=1)
    translate.add_argument("--input", type=Path, required=True)
    translate.add_argument("--output", type=Path, required=True)
    translate.add_argument("--against", type=Path, default=None)
    translate.add_argument("--reference", default="the reference", help="what --against holds, for the report")
    translate.add_argument("--floor", default="exact", help="exact, or a precision of MIN_AGREEMENT")
    translate.add_argument("--perturb", action="store_true", help="change the last output line (a test's miss)")
    commands.add_parser("probe").add_argument("--device", default="cuda")
    tensorrt = commands.add_parser("tensorrt")
    for option in ("--model", "--output", "--input"):
        tensorrt.add_argument(option, type=Path, required=True)
    marian = commands.add_parser("marian")
    marian.add_argument("--output", type=Path, required=True)
    marian.add_argument("--vocab-size", type=int, required=True)
    marian.add_argument("--sizes", default="{}", help="JSON: MarianConfig sizes over opus-mt's")
    return parser


# --- the run -----------------------------------------------------------------------------------------------------

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
