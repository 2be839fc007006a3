"""Where TensorRT (or TensorRT-RTX) and a GPU are: the lazy import, the platform's facts, and whether engines fit here.

TensorRT's native libraries come from NVIDIA's own package index, never with a plain install of this
package, so every TensorRT command starts here and fails in one line when something is missing.
TensorRT for RTX is TensorRT's builder API and ONNX parser in a library of its own, on PyPI: its builder
needs no GPU (an ahead-of-time build), and its engines run only on compute capability 8.0, 8.6, 8.9 and
12.0 or later (RTX and A100-class cards; not Hopper, not Jetson).
Engines (plans) are tied to the library version that built them and to the GPU's compute capability
(TensorRT) or the set a TensorRT-RTX build targets; the engine manifest records both and `engine_mismatch`
compares them before loading.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..artifacts.engine_dir import RTX, TARGET_NAMES, TENSORRT
from ..core.errors import TfmExportError

INSTALL_HINT = ("on a machine with an NVIDIA GPU, `pip install tfm-export[gpu]` with NVIDIA's package index "
                "added (TensorRT's installation guide names it), or JetPack 6 on Jetson")
RTX_INSTALL_HINT = "pip install 'tfm-export[rtx]' (TensorRT for RTX, from PyPI; builds without a GPU)"
MIN_COMPUTE_CAPABILITY = (7, 5)  # TensorRT 10/11 build for Turing and newer (Jetson Orin is 8.7)
# What a default TensorRT-RTX build runs on: these, and RTX_NEWER_FROM and later. Turing (7.5) needs a build of its
# own; Hopper (9.0) and Blackwell data-centre cards (10.x) are refused.
RTX_COMPUTE_CAPABILITIES = ((8, 0), (8, 6), (8, 9))
RTX_NEWER_FROM = (12, 0)


@dataclass(frozen=True)
class Library:
    """One builder/runtime library: its import name and the major versions whose API this package uses."""

    target: str
    module: str
    majors: tuple[int, ...]
    supported: str  # what to use instead, for the version gate's message
    install_hint: str

    @property
    def name(self) -> str:
        return TARGET_NAMES[self.target]


LIBRARIES = {TENSORRT: Library(TENSORRT, "tensorrt", (10, 11), "use TensorRT 10.x (JetPack 6 ships 10.3) or 11.x",
                               INSTALL_HINT),
             RTX: Library(RTX, "tensorrt_rtx", (1,), "use TensorRT-RTX 1.x", RTX_INSTALL_HINT)}


class TensorRTUnavailable(TfmExportError):
    """TensorRT, CUDA or a GPU is missing, or the engines were built for another platform."""


def _cc_text(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


RTX_RUNS_ON = [*map(_cc_text, RTX_COMPUTE_CAPABILITIES), f"{_cc_text(RTX_NEWER_FROM)}+"]


@dataclass(frozen=True)
class Platform:
    """What an engine is bound to: the library and its exact version, and the GPU it was built on (None for a
    TensorRT-RTX build, which needs none) or, at run time, the GPU here."""

    tensorrt: str  # the library's version, e.g. "10.3.0.30" or "1.7.1.116"
    gpu: str | None  # e.g. "NVIDIA H100 80GB HBM3"
    compute_capability: str | None  # e.g. "9.0"
    target: str = TENSORRT

    @classmethod
    def from_dict(cls, recorded: dict[str, Any]) -> Platform:
        """The platform an engine manifest's `tensorrt` section records."""
        return cls(recorded["tensorrt"], recorded.get("gpu"), recorded.get("compute_capability"), recorded["target"])

    @property
    def tensorrt_major(self) -> int:
        return major_version(self.tensorrt)

    @property
    def library(self) -> str:
        return f"{TARGET_NAMES[self.target]} {self.tensorrt}"

    def to_dict(self) -> dict[str, Any]:
        out = {"target": self.target, "tensorrt": self.tensorrt, "gpu": self.gpu,
               "compute_capability": self.compute_capability}
        return {**out, "runs_on_compute_capabilities": RTX_RUNS_ON} if self.target == RTX else out

    def describe(self) -> str:
        if self.gpu is None:
            return (f"{self.library}, built without a GPU (its engines run on compute capability "
                    f"{', '.join(RTX_RUNS_ON)})")
        return f"{self.library} on {self.gpu} (compute capability {self.compute_capability})"


def major_version(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        raise TensorRTUnavailable(f"cannot read TensorRT's version {version!r}") from None


def import_tensorrt(target: str = TENSORRT) -> ModuleType:
    """The library's module, or one line saying what to install. The PyPI `tensorrt` placeholder installs
    without the libraries, so a module without `Builder` counts as missing too."""
    library = LIBRARIES[target]
    try:
        trt = importlib.import_module(library.module)
    except (ImportError, OSError) as exc:
        raise TensorRTUnavailable(f"{library.name} is not installed ({type(exc).__name__}: {exc}); "
                                  f"{library.install_hint}") from None
    if not hasattr(trt, "Builder"):
        raise TensorRTUnavailable(f"the {library.module} package here has no native libraries (a placeholder); "
                                  f"{library.install_hint}")
    if major_version(trt.__version__) not in library.majors:
        raise TensorRTUnavailable(f"{library.name} {trt.__version__} is not supported; {library.supported}")
    return trt


def _cuda_runtime() -> ModuleType | None:
    """cuda-python's CUDA runtime bindings (tfm-export[gpu]), under either of its module names, or None."""
    for name in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            return importlib.import_module(name)
        except (ImportError, OSError):
            continue
    return None


CU_COMPUTE_CAPABILITY = (75, 76)  # CUdevice_attribute: major, minor


def gpu_facts(target: str = TENSORRT) -> tuple[str, str]:
    """(name, compute capability) of GPU 0, read from the NVIDIA driver itself (libcuda, through ctypes): no
    PyTorch or CUDA toolkit needed, and a machine without a driver or a GPU says so in one line."""
    import ctypes
    where = ("TensorRT engines are built and run on an NVIDIA GPU: " + INSTALL_HINT if target == TENSORRT else
             f"TensorRT-RTX engines run on an NVIDIA GPU of compute capability {', '.join(RTX_RUNS_ON)} (they "
             "build without one)")
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise TensorRTUnavailable(f"no CUDA GPU is visible (no NVIDIA driver: libcuda.so.1 not found); {where}") \
            from None
    count, device = ctypes.c_int(0), ctypes.c_int(0)
    if cuda.cuInit(0) or cuda.cuDeviceGetCount(ctypes.byref(count)) or not count.value:
        raise TensorRTUnavailable(f"no CUDA GPU is visible (the NVIDIA driver finds none); {where}")
    name, (major, minor) = ctypes.create_string_buffer(256), (ctypes.c_int(0), ctypes.c_int(0))
    cuda.cuDeviceGet(ctypes.byref(device), 0)
    cuda.cuDeviceGetName(name, len(name), device)
    for value, attribute in zip((major, minor), CU_COMPUTE_CAPABILITY, strict=True):
        cuda.cuDeviceGetAttribute(ctypes.byref(value), attribute, device)
    return name.value.decode(errors="replace"), f"{major.value}.{minor.value}"


def cuda_stream() -> int:
    """A CUDA stream of its own for TensorRT's enqueues (cuda-python's, tfm-export[gpu]), or 0, the default stream,
    without it. Created blocking, so that copies on the default stream (ONNX Runtime's uploads and downloads) wait
    for it."""
    cudart = _cuda_runtime()
    if cudart is None:
        return 0
    error, stream = cudart.cudaStreamCreate()
    if int(error) != 0:
        raise TensorRTUnavailable(f"the CUDA runtime cannot create a stream ({error}); check the NVIDIA driver")
    return int(stream)


def current_platform(target: str = TENSORRT) -> Platform:
    """The library and the GPU here, for running engines (and for building TensorRT ones)."""
    trt = import_tensorrt(target)
    return Platform(trt.__version__, *gpu_facts(target), target)


def build_platform(target: str) -> Platform:
    """What engines built here are bound to: TensorRT builds for this GPU (which it needs); TensorRT-RTX
    builds without one, for the compute capabilities its engines run on."""
    if target == RTX:
        return Platform(import_tensorrt(RTX).__version__, None, None, RTX)
    platform = current_platform(TENSORRT)
    check_gpu_supported(platform)
    return platform


def missing_reason(target: str = TENSORRT) -> str | None:
    """Why engines of `target` cannot be built and run here (the first clause of the error), or None."""
    try:
        check_gpu_supported(current_platform(target))
    except TensorRTUnavailable as exc:
        return str(exc).split(";")[0]
    return None


def _capability(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def rtx_runs_on(compute_capability: str) -> bool:
    cc = _capability(compute_capability)
    return cc in RTX_COMPUTE_CAPABILITIES or cc >= RTX_NEWER_FROM


def check_gpu_supported(platform: Platform) -> None:
    """Engines for a GPU the library has no kernels for would fail deep inside the build or the load; say so
    first. Every supported GPU has fast fp16 and int8, so a requested precision is never silently dropped here."""
    if platform.target == RTX:
        if not rtx_runs_on(platform.compute_capability):
            raise TensorRTUnavailable(f"{platform.gpu} (compute capability {platform.compute_capability}): "
                                      f"TensorRT-RTX does not run on it (its engines run on compute capability "
                                      f"{', '.join(RTX_RUNS_ON)}); build TensorRT engines for this GPU instead "
                                      "(`tfm-export trt --target tensorrt`)")
        return
    if _capability(platform.compute_capability) < MIN_COMPUTE_CAPABILITY:
        need = _cc_text(MIN_COMPUTE_CAPABILITY)
        raise TensorRTUnavailable(f"{platform.gpu} (compute capability {platform.compute_capability}) is older than "
                                  f"TensorRT {platform.tensorrt} supports (needs {need} or newer)")


def engine_mismatch(recorded: dict[str, Any], here: Platform) -> str | None:
    """Why engines built on `recorded` cannot run `here` (a GPU that check_gpu_supported passed), or None. A
    different GPU model of the same architecture runs TensorRT engines (possibly slower); that is not a mismatch,
    and TensorRT-RTX engines run on every GPU it supports."""
    if recorded.get("tensorrt") != here.tensorrt:
        name = TARGET_NAMES[here.target]
        return (f"built with {name} {recorded.get('tensorrt')}, this machine has {name} {here.tensorrt} "
                "(plans only load in the exact version that built them)")
    if here.target == TENSORRT and recorded.get("compute_capability") != here.compute_capability:
        return (f"built for compute capability {recorded.get('compute_capability')} ({recorded.get('gpu')}), this "
                f"GPU is {here.compute_capability} ({here.gpu})")
    return None
