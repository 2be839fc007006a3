"""ONNX Runtime sessions for the exported graphs, with the CPU options that matter."""

from __future__ import annotations

import functools
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..core.errors import TfmExportError, first_line
from ..core.graph_spec import FUSED_MIN_ONNXRUNTIME
from ..core.machine import MAX_THREADS

OPT_LEVELS = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


# the variables that turn the pre-packed graphs off (=off), the first set winning: TFM_GRAPH_CACHE is the name
# they had before they were called what they are
PREPACKED_GRAPHS_ENV = ("TFM_PREPACKED_GRAPHS", "TFM_GRAPH_CACHE")
CONSTANT_FOLDING = "ConstantFolding"  # ONNX Runtime's name for the optimizer


@dataclass(frozen=True)
class SessionOptions:
    """ONNX Runtime's session settings (what the step backends do besides is step_graph.StepOptions'). Defaults
    follow TFM_THREADS and TFM_ORT_OPT_LEVEL, as the CLI's flags do; checked when a session opens."""

    intra_op_threads: int | str = os.environ.get("TFM_THREADS", 0)  # 0 = ONNX Runtime's choice
    optimization: str = os.environ.get("TFM_ORT_OPT_LEVEL", "all")
    # ONNX Runtime's CPU memory arena. None: off for decoder_step_search, whose IO-bound steps allocate little
    # (less peak memory, speed level), on for the graphs that allocate whole caches every step
    memory_arena: bool | None = None
    # intra-op threads spin between a run's ops and stop when the run returns (session.force_spinning_stop):
    # quick hand-offs within a decoder step, a free core for the search between steps. False: they sleep.
    spinning: bool = True
    # "cuda": every session on the CUDA execution provider, or an error saying why not; "cpu". None: the backend's
    # own (runtime.backends: the GPU for TensorRT, else the CPU). The one place a device is given.
    device: str | None = None
    tf32: bool = False  # on CUDA, fp32 MatMuls in TF32 (faster, ~1e-3 relative): off, so that fp32 is fp32
    cuda_graphs: bool = False  # on CUDA, the device backend's steps captured as CUDA graphs and replayed
    tensorrt_ep: bool = False  # with device "cuda": ONNX Runtime's TensorRT execution provider first
    fold_qdq: bool = False  # run Q/DQ as plain float ops, weight DequantizeLinear constant-folded (see OrtBackend)
    # MatMul weights packed into the CPU kernels' layout at load (a copy of each on the heap); off: the weights are
    # read where they lie (a large model's external file stays mapped, once)
    prepacking: bool = True
    # ONNX Runtime's constant folding at load. Off: a tied table's Transpose is left to the MatMul that reads it
    # (fused into it), instead of a transposed copy made on the heap, in seconds, at every load
    constant_folding: bool = True
    # on the CPU, open the model directory's pre-packed graphs where they match this machine
    # (runtime.prepacked_graphs)
    prepacked_graphs: bool = next((os.environ[n] for n in PREPACKED_GRAPHS_ENV if n in os.environ), "on") != "off"

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def placed(self) -> str:
        """Where a session opened with these options runs: the CPU where no device is given (the door gives a
        backend its default device before any session opens)."""
        return self.device or "cpu"


DEFAULT_OPTIONS = SessionOptions()


def check_threads(threads: int | str, what: str = "thread count") -> int:
    """A thread count in 0..MAX_THREADS (0 = the library's default), from a flag or TFM_THREADS."""
    if not str(threads).isdigit():
        raise TfmExportError(f"{what} {threads!r} (TFM_THREADS?) is not a whole number")
    if int(threads) > MAX_THREADS:
        raise TfmExportError(f"{what} {threads} is more than {MAX_THREADS} (4x this machine's {os.cpu_count()} "
                             "cores); give at most that, or 0 for the default")
    return int(threads)
CUDA_PROVIDER, TENSORRT_PROVIDER = "CUDAExecutionProvider", "TensorrtExecutionProvider"


def runs_fused_graphs() -> bool:
    """Whether this ONNX Runtime computes decoder_step_search_fused correctly (graph_spec.FUSED_MIN_ONNXRUNTIME)."""
    found = re.match(r"(\d+)\.(\d+)", ort.__version__)
    return bool(found) and tuple(int(v) for v in found.groups()) >= FUSED_MIN_ONNXRUNTIME


def has_cuda_provider() -> bool:
    """Whether this onnxruntime build can run graphs on an NVIDIA GPU."""
    return CUDA_PROVIDER in ort.get_available_providers()


def require_device(options: SessionOptions) -> None:
    """CUDA (and TensorRT) execution providers only where this onnxruntime build has them."""
    available = ort.get_available_providers()
    if options.device not in ("cpu", "cuda"):
        raise TfmExportError(f"unknown device {options.device!r}; use cpu or cuda")
    if options.tensorrt_ep and not options.on_gpu:
        raise TfmExportError("--ort-trt needs --device cuda")
    if options.on_gpu and CUDA_PROVIDER not in available:
        raise TfmExportError("--device cuda: this onnxruntime has no CUDAExecutionProvider (CPU build, or no GPU); "
                             "install tfm-export[gpu] on a machine with an NVIDIA GPU, or use --device cpu")
    if options.tensorrt_ep and TENSORRT_PROVIDER not in available:
        raise TfmExportError("--ort-trt: this onnxruntime has no TensorrtExecutionProvider; install onnxruntime-gpu "
                             "with TensorRT libraries, or drop --ort-trt")


def open_session(path: Path, options: SessionOptions = DEFAULT_OPTIONS, so: ort.SessionOptions | None = None,
                 capture: bool = False) -> ort.InferenceSession:
    """so: ONNX Runtime options to start from (shared initializers, say); the fields below are set on them.
    capture: on CUDA, let the session capture CUDA graphs (the step graph of the device backend)."""
    if options.optimization not in OPT_LEVELS:
        raise TfmExportError(f"ONNX Runtime optimisation level {options.optimization!r} (TFM_ORT_OPT_LEVEL?) is not "
                             f"one of {', '.join(OPT_LEVELS)}")
    so = so or ort.SessionOptions()
    so.intra_op_num_threads = check_threads(options.intra_op_threads)
    so.inter_op_num_threads = 1
    so.graph_optimization_level = OPT_LEVELS[options.optimization]
    so.enable_cpu_mem_arena = options.memory_arena is not False
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if options.spinning else "0")
    so.add_session_config_entry("session.force_spinning_stop", "1")
    if options.fold_qdq:
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    if not options.prepacking and not _has_entry(so, "session.disable_prepacking"):
        so.add_session_config_entry("session.disable_prepacking", "1")
    try:
        with warnings.catch_warnings():  # a provider this build lacks: check_on_device names it, in one line
            warnings.simplefilter("ignore", UserWarning)
            session = ort.InferenceSession(str(path), so, providers=providers(options, capture),
                                           disabled_optimizers=None if options.constant_folding else [CONSTANT_FOLDING])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        raise TfmExportError(f"{path}: ONNX Runtime cannot load this graph ({first_line(exc)})") from None
    check_on_device(session, options, path)
    return session


def _has_entry(so: ort.SessionOptions, key: str) -> bool:
    """Whether these options already set `key` (ONNX Runtime warns of an entry set twice)."""
    try:
        so.get_session_config_entry(key)
    except Exception:  # onnxruntime raises its own Fail for a key never set
        return False
    return True


def providers(options: SessionOptions, capture: bool = False) -> list:
    """The execution providers a session asks for, most preferred first, with their options: on CUDA, TF32 only
    when asked for, CUDA graphs only where `capture`."""
    chosen: list = ["CPUExecutionProvider"]
    if options.on_gpu:
        preload_cuda_libraries()
        cuda = {"use_tf32": "1" if options.tf32 else "0"}
        if capture and options.cuda_graphs:
            cuda["enable_cuda_graph"] = "1"
        chosen.insert(0, (CUDA_PROVIDER, cuda))
    if options.tensorrt_ep:
        chosen.insert(0, TENSORRT_PROVIDER)
    return chosen


@functools.cache
def preload_cuda_libraries() -> None:
    """Without PyTorch imported first, ONNX Runtime must find the CUDA and cuDNN libraries itself; from 1.21 it can
    load them from the nvidia-* wheels (preload_dlls). Where it cannot, check_on_device says so."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception:  # a missing library is named by check_on_device, with what to do
            pass


def check_on_device(session: ort.InferenceSession, options: SessionOptions, path: Path) -> None:
    """A session asked for CUDA that ONNX Runtime built for the CPU alone (its CUDA libraries failed to load: it
    only logs a warning) is an error, never a silent CPU decode."""
    if not options.on_gpu:
        return
    wanted = TENSORRT_PROVIDER if options.tensorrt_ep else CUDA_PROVIDER
    if wanted not in session.get_providers():
        raise TfmExportError(f"{path}: --device cuda, but ONNX Runtime runs this graph on "
                             f"{', '.join(session.get_providers())} only: its {wanted} could not load (the CUDA and "
                             "cuDNN libraries it needs were not found, or no NVIDIA GPU is usable); install "
                             "onnxruntime-gpu's CUDA runtime (pip install 'onnxruntime-gpu[cuda,cudnn]') or put the "
                             "libraries on LD_LIBRARY_PATH, or use --device cpu")


def run(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    try:
        return dict(zip(names, session.run(names, feeds), strict=True))
    except Exception as exc:  # onnxruntime's own exception types; an input the graph cannot take
        raise TfmExportError(f"ONNX Runtime failed: {first_line(exc)}") from None
