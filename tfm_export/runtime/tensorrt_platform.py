"""Where TensorRT and a GPU are: the lazy import, the platform's facts, and whether engines fit here.

TensorRT's native libraries come from NVIDIA's own package index, never with a plain install of this
package, so every TensorRT command starts here and fails in one line when something is missing.
Engines (plans) are tied to the TensorRT version that built them and to the GPU's compute
capability; the engine manifest records both and `engine_mismatch` compares them before loading.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from ..core.errors import TfmExportError

INSTALL_HINT = ("on a machine with an NVIDIA GPU, `pip install tfm-export[gpu]` with NVIDIA's package index "
                "added (TensorRT's installation guide names it), or JetPack 6 on Jetson")
MIN_COMPUTE_CAPABILITY = (7, 5)  # TensorRT 10/11 build for Turing and newer (Jetson Orin is 8.7)
SUPPORTED_MAJORS = (10, 11)


class TensorRTUnavailable(TfmExportError):
    """TensorRT, CUDA or a GPU is missing, or the engines were built for another platform."""


@dataclass(frozen=True)
class Platform:
    """What an engine is bound to: the exact TensorRT version and the GPU architecture."""

    tensorrt: str  # e.g. "10.3.0.30"
    gpu: str  # e.g. "NVIDIA H100 80GB HBM3"
    compute_capability: str  # e.g. "9.0"

    @property
    def tensorrt_major(self) -> int:
        return major_version(self.tensorrt)

    def to_dict(self) -> dict[str, str]:
        return {"tensorrt": self.tensorrt, "gpu": self.gpu, "compute_capability": self.compute_capability}


def major_version(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        raise TensorRTUnavailable(f"cannot read TensorRT's version {version!r}") from None


def import_tensorrt() -> ModuleType:
    """The tensorrt module, or one line saying what to install. The PyPI `tensorrt` placeholder installs
    without the libraries, so a module without `Builder` counts as missing too."""
    try:
        import tensorrt as trt
    except (ImportError, OSError) as exc:
        raise TensorRTUnavailable(f"TensorRT is not installed ({type(exc).__name__}: {exc}); {INSTALL_HINT}") from None
    if not hasattr(trt, "Builder"):
        raise TensorRTUnavailable(f"the tensorrt package here has no native libraries (a placeholder); {INSTALL_HINT}")
    if major_version(trt.__version__) not in SUPPORTED_MAJORS:
        raise TensorRTUnavailable(f"TensorRT {trt.__version__} is not supported; use TensorRT 10.x (JetPack 6 ships "
                                  "10.3) or 11.x")
    return trt


def gpu_facts() -> tuple[str, str]:
    """(name, compute capability) of GPU 0, read through PyTorch's CUDA runtime."""
    import torch
    if not torch.cuda.is_available():
        raise TensorRTUnavailable("no CUDA GPU is visible (PyTorch: torch.cuda.is_available() is False); TensorRT "
                                  f"engines are built and run on an NVIDIA GPU: {INSTALL_HINT}")
    major, minor = torch.cuda.get_device_capability(0)
    return torch.cuda.get_device_name(0), f"{major}.{minor}"


def current_platform() -> Platform:
    trt = import_tensorrt()
    return Platform(trt.__version__, *gpu_facts())


def missing_reason() -> str | None:
    """Why TensorRT engines cannot be built or run here (the first clause of the error), or None."""
    try:
        current_platform()
    except TensorRTUnavailable as exc:
        return str(exc).split(";")[0]
    return None


def check_gpu_supported(platform: Platform) -> None:
    """Engines for a GPU TensorRT 10/11 has no kernels for would fail deep inside the build; say so first.
    Every supported GPU has fast fp16 and int8, so a requested precision is never silently dropped here."""
    have = tuple(int(x) for x in platform.compute_capability.split("."))
    if have < MIN_COMPUTE_CAPABILITY:
        need = ".".join(map(str, MIN_COMPUTE_CAPABILITY))
        raise TensorRTUnavailable(f"{platform.gpu} (compute capability {platform.compute_capability}) is older than "
                                  f"TensorRT {platform.tensorrt} supports (needs {need} or newer)")


def engine_mismatch(recorded: dict[str, str], here: Platform) -> str | None:
    """Why engines built on `recorded` cannot run `here`, or None. A different GPU model of the same
    architecture runs them (possibly slower); that is not a mismatch."""
    if recorded.get("tensorrt") != here.tensorrt:
        return (f"built with TensorRT {recorded.get('tensorrt')}, this machine has TensorRT {here.tensorrt} "
                "(plans only load in the exact version that built them)")
    if recorded.get("compute_capability") != here.compute_capability:
        return (f"built for compute capability {recorded.get('compute_capability')} ({recorded.get('gpu')}), this "
                f"GPU is {here.compute_capability} ({here.gpu})")
    return None
