"""Every backend the runtime has, opened by one function from what the user names: a model directory, an engine
directory, a checkpoint or a Hugging Face directory. Openers are registered by name (as CTranslate2 registers its
model loaders), so that tfm-run, the Triton models and the benchmarks open a backend the same way, and each returns
the backend with what a Translator needs beside it: the vocabulary, config, decoding rules and limits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..artifacts.engine_dir import EngineDir, is_engine_dir
from ..artifacts.manifest import MANIFEST, not_exported
from ..artifacts.model_dir import ModelDir
from ..core.config import ModelConfig
from ..core.errors import TfmExportError
from ..core.extras import require_extra
from ..core.token_rules import TokenRules
from ..core.tokenizer import Vocabulary
from .decoding import StepBackend
from .session import DEFAULT_OPTIONS, SessionOptions, check_threads, require_device


@dataclass(frozen=True)
class Opened:
    """A backend and the model facts decoding with it needs."""

    backend: StepBackend
    vocab: Vocabulary
    config: ModelConfig
    rules: TokenRules
    limits: dict[str, int] | None = None  # what engines were built for; None: the model's positions


# (model path, device, options, --vocab files) -> the opened backend
Opener = Callable[[Path, str, SessionOptions, Sequence[Path]], Opened]
BACKENDS: dict[str, Opener] = {}
DEFAULT_DEVICES = {"tensorrt": "cuda"}  # every other backend: the CPU


def register_backend(name: str) -> Callable[[Opener], Opener]:
    def register(opener: Opener) -> Opener:
        BACKENDS[name] = opener
        return opener
    return register


def default_backend(model: Path) -> str:
    if model.is_dir():
        return "tensorrt" if is_engine_dir(model) else "onnxruntime"
    return "torch"


def open_backend(model: str | Path, kind: str | None = None, device: str | None = None,
                 options: SessionOptions = DEFAULT_OPTIONS, vocab: Sequence[Path] = ()) -> Opened:
    """The backend `kind` (default: what the path is: a model directory runs on ONNX Runtime, an engine directory
    on TensorRT, a checkpoint on PyTorch) on `device` (default: the GPU for TensorRT, else the CPU)."""
    model = Path(model)
    if not model.exists():
        raise TfmExportError(f"{model}: model not found; give an exported model directory (tfm-export onnx) "
                             "or a checkpoint file")
    kind = kind or default_backend(model)
    if kind not in BACKENDS:
        raise TfmExportError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    if options.tensorrt_ep and kind != "onnxruntime":
        raise TfmExportError(f"--ort-trt is ONNX Runtime's TensorRT provider; it does not apply to --backend {kind}")
    return BACKENDS[kind](model, device or DEFAULT_DEVICES.get(kind, "cpu"), options, vocab)


def _model_dir(model: Path, vocab: Sequence[Path]) -> ModelDir:
    """The ONNX Runtime backends' directory; whatever else was given is one line saying what to do instead."""
    if is_engine_dir(model):
        raise TfmExportError(f"{model}: holds TensorRT engines; run it with --backend tensorrt, or give the model "
                             "directory they were built from")
    if model.is_file():
        raise TfmExportError(f"{model}: is a checkpoint; the onnxruntime backend takes a model directory "
                             "(make one with `tfm-export onnx`), or use --backend torch")
    if not (model / MANIFEST).exists():
        raise TfmExportError(not_exported(model, "model directory", "translate with it directly (--backend torch)"))
    if vocab:
        raise TfmExportError("--vocab is only for checkpoints; a model directory carries its own tokenizer")
    return ModelDir.read(model)


def _of_directory(backend: StepBackend, source: ModelDir | EngineDir, limits: dict[str, int] | None = None) -> Opened:
    return Opened(backend, source.vocabulary(), source.config, source.rules, limits)


@register_backend("onnxruntime")
def _onnxruntime(model: Path, device: str, options: SessionOptions, vocab: Sequence[Path]) -> Opened:
    """decoder_step_search (on the CPU its fused twin, where the directory has it) with the cache in host arrays,
    or on the GPU all in device memory; the contract's decoder_step where the directory has no search step."""
    from .ort_backend import OrtBackend
    from .ort_device import OrtDeviceBackend
    from .ort_search import SEARCH, OrtSearchBackend
    options = _on_device(options, device)
    model_dir = _model_dir(model, vocab)
    if options.search_graph and model_dir.has(SEARCH):
        kind = OrtSearchBackend if device == "cpu" else OrtDeviceBackend
        return _of_directory(kind.from_dir(model_dir, options), model_dir)
    return _of_directory(OrtBackend.from_dir(model_dir, options), model_dir)


@register_backend("onnxruntime-generate")
def _generate(model: Path, device: str, options: SessionOptions, vocab: Sequence[Path]) -> Opened:
    """generate.onnx: the whole search in ONNX Runtime's BeamSearch op instead of the loop."""
    from .generate_backend import GenerateBackend
    options = _on_device(options, device)
    model_dir = _model_dir(model, vocab)
    return _of_directory(GenerateBackend.from_dir(model_dir, options), model_dir)


@register_backend("tensorrt")
def _tensorrt(model: Path, device: str, options: SessionOptions, vocab: Sequence[Path]) -> Opened:
    from .tensorrt_backend import TrtBackend
    if device != "cuda":
        raise TfmExportError("TensorRT engines run on the GPU; drop --device cpu (or use --backend onnxruntime)")
    if not is_engine_dir(model):
        raise TfmExportError(f"{model}: is not a TensorRT engine directory; build one with `tfm-export trt "
                             "--model MODEL_DIR --output ENGINES`")
    if vocab:
        raise TfmExportError("--vocab is only for checkpoints; an engine directory carries its own tokenizer")
    backend = TrtBackend(model)  # the directory verified first, then what is missing here, in one line
    return _of_directory(backend, backend.engine_dir, backend.limits)


@register_backend("torch")
def _torch(model: Path, device: str, options: SessionOptions, vocab: Sequence[Path]) -> Opened:
    require_extra("export", "--backend torch")
    import torch  # only this backend needs PyTorch

    from ..model.loading import load_checkpoint
    from .torch_backend import TorchBackend
    if (model / MANIFEST).is_file():
        raise TfmExportError(f"{model}: is a model directory; the torch backend takes a checkpoint file or a "
                             "Hugging Face model directory")
    if check_threads(options.intra_op_threads):
        torch.set_num_threads(int(options.intra_op_threads))
    if device == "cuda" and not torch.cuda.is_available():
        raise TfmExportError("--device cuda: PyTorch sees no CUDA GPU on this machine; use --device cpu")
    ckpt = load_checkpoint(model, list(vocab))
    return Opened(TorchBackend(ckpt.model, device), ckpt.vocab, ckpt.config, ckpt.rules)


def _on_device(options: SessionOptions, device: str) -> SessionOptions:
    options = dataclasses.replace(options, device=device)
    require_device(options)
    return options
