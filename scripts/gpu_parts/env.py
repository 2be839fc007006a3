"""The env part: what runs where. Python, PyTorch and ONNX Runtime's versions and providers, onnxruntime-gpu
installed from its pieces, the hidden packages of the rehearsal, and a session made on CUDA without PyTorch."""

from __future__ import annotations

import importlib.util
import os
import shutil
import site
import subprocess
import zipfile
from collections.abc import Sequence
from pathlib import Path

from .harness import (
    CARRIED_PARTS,
    FAILED,
    HIDDEN,
    NOT_INSTALLED,
    OK,
    ORT_PARTS,
    ORT_TARGET,
    ROOT,
    SCRIPT,
    SKIPPED,
    Check,
    CheckError,
    Environment,
    Part,
    Report,
)


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
