"""The one door to every backend: `open_backend` opens what the user names (a model directory, an engine
directory, a checkpoint or a Hugging Face directory) with the backend asked for, and returns its searcher with what
a Translator needs beside it: the vocabulary, config, decoding rules and limits. tfm-run, the Triton models, verify,
quantization's calibration, export's parity check and the benchmarks all open backends here, nowhere else.

Each file of this package is one backend, named by the cache it drives, and opened by one opener in BACKENDS, under
its name (runtime.backend_names):
- concat (onnxruntime-concat): the contract's decoder_step, whose graph returns the grown cache (any session loader:
  ONNX Runtime, a native Triton model);
- inplace (onnxruntime-inplace): decoder_step_search over IO binding, the cache in host buffers written in place;
- device (onnxruntime-device): decoder_step_search with all decode memory on the device (ONNX Runtime's CUDA
  provider, without PyTorch);
- generate (onnxruntime-generate): generate.onnx, the whole search in one ONNX Runtime call (a searcher, not a step
  backend);
- tensorrt: TensorRT engines, their cache in a PingPong of ONNX Runtime CUDA memory;
- reference (torch): the PyTorch reference model with a KV cache.
Which one a path gets when none is named is default_for's choice (onnxruntime_for's among ONNX Runtime's step
backends); the device is options.device, nowhere else.
Openers are registered by name (as CTranslate2 registers its model loaders); each imports its backend's libraries
only when called.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from ...artifacts.engine_dir import EngineDir
from ...artifacts.manifest import ENGINE_FORMAT, MANIFEST, manifest_format, not_exported
from ...artifacts.model_dir import ModelDir
from ...core.config import ModelConfig
from ...core.errors import TfmExportError
from ...core.extras import require_extra
from ...core.memory import release_file_pages, total_memory_bytes
from ...core.token_rules import TokenRules
from ...core.tokenizer import Vocabulary
from ..backend_names import (
    CONCAT,
    DEFAULT_DEVICES,
    DEVICE,
    GENERATE,
    INPLACE,
    ONNXRUNTIME,
    STEP_BACKENDS,
    TENSORRT,
    TORCH,
)
from ..search import LoopSearcher, Searcher
from ..session import DEFAULT_OPTIONS, SessionOptions, check_threads, require_device
from ..step import StepBackend
from ..step_graph import DEFAULT_STEP, StepOptions
from .loaders import SessionLoader, open_graph

log = logging.getLogger(__name__)


class Given(Enum):
    """What a model path is, decided once from the path and its manifest's declared format."""

    MODEL_DIR = "model directory"
    ENGINE_DIR = "engine directory"
    CHECKPOINT = "checkpoint"  # anything else that exists: a checkpoint file (either format), or refused as one
    MODEL_SOURCE_DIR = "Hugging Face model directory"  # a directory without a manifest: a source to export


def classify(model: Path) -> Given:
    if not model.exists():
        raise TfmExportError(f"{model}: model not found; give an exported model directory (tfm-export onnx) "
                             "or a checkpoint file")
    if not model.is_dir():
        return Given.CHECKPOINT
    if not (model / MANIFEST).exists():
        return Given.MODEL_SOURCE_DIR
    return Given.ENGINE_DIR if manifest_format(model) == ENGINE_FORMAT else Given.MODEL_DIR


@dataclass(frozen=True)
class Opened:
    """A searcher and the model facts decoding with it needs."""

    searcher: Searcher
    vocab: Vocabulary
    config: ModelConfig
    rules: TokenRules
    limits: dict[str, int] | None = None  # what engines were built for; None: the model's positions
    backend: StepBackend | None = None  # the step backend the searcher drives (None: generate.onnx)
    source: ModelDir | EngineDir | None = None  # the directory opened (None: a checkpoint, run on PyTorch)


@dataclass(frozen=True)
class Request:
    """What an opener is asked to open: options.device is set (the door resolves the backend's default)."""

    path: Path
    given: Given
    options: SessionOptions
    vocab: Sequence[Path]
    loader: SessionLoader | None  # where the graphs run, when not in ONNX Runtime sessions made here
    step: StepOptions  # the step backends': which decoder_step_search graph, how a full cache grows

    @property
    def device(self) -> str:
        assert self.options.device is not None
        return self.options.device


Opener = Callable[[Request], Opened]
# the concrete backends, one per file of this package, by their names (backend_names)
BACKENDS: dict[str, Opener] = {}
RUN_EXTRA_BYTES = 1 << 29  # what a CPU translation holds besides its weights: ONNX Runtime, caches, logits (0.5 GiB)


def register_backend(name: str) -> Callable[[Opener], Opener]:
    def register(opener: Opener) -> Opener:
        BACKENDS[name] = opener
        return opener
    return register


def backend_names() -> list[str]:
    """What `--backend` accepts: every concrete backend, and onnxruntime for default_for's choice among its own."""
    return [ONNXRUNTIME, *BACKENDS]


def open_backend(model: str | Path, backend: str | None = None, options: SessionOptions = DEFAULT_OPTIONS,
                 vocab: Sequence[Path] = (), loader: SessionLoader | None = None,
                 step: StepOptions = DEFAULT_STEP) -> Opened:
    """The backend named (default: default_for what the path is), on options.device (default: the GPU for
    TensorRT, else the CPU). loader: how each graph becomes a session (default: ONNX Runtime); the bls layout's
    graphs are native Triton models. step: how ONNX Runtime's step backends run decoder_step_search."""
    path = Path(model)
    given = classify(path)
    if backend is not None and backend not in backend_names():
        raise TfmExportError(f"unknown backend {backend!r}; choose one of {', '.join(backend_names())}")
    name = backend or default_for(path, given, options.device)
    options = dataclasses.replace(options, device=options.device or DEFAULT_DEVICES.get(name, "cpu"))
    if options.tensorrt_ep and name not in (ONNXRUNTIME, *STEP_BACKENDS):
        raise TfmExportError(f"--ort-trt is ONNX Runtime's TensorRT provider; it does not apply to --backend {name}")
    if name == ONNXRUNTIME:
        name = onnxruntime_for(path, given, options.device)
    return BACKENDS[name](Request(path, given, options, vocab, loader, step))


def default_for(path: Path, given: Given, device: str | None) -> str:
    """The backend a path gets when none is named: TensorRT for an engine directory, PyTorch for a checkpoint,
    ONNX Runtime's step backend for the rest (onnxruntime_for; a Hugging Face directory runs on PyTorch only when
    asked: ONNX Runtime's opener says what it is and how to export it)."""
    if given is Given.ENGINE_DIR:
        return TENSORRT
    if given is Given.CHECKPOINT:
        return TORCH
    return onnxruntime_for(path, given, device or "cpu")


def onnxruntime_for(path: Path, given: Given, device: str) -> str:
    """What `--backend onnxruntime` runs a model directory with on `device`: decoder_step_search in place on the
    CPU, all on the device on a GPU, the contract's concat cache where the directory has no decoder_step_search.
    Anything but a model directory goes to the in-place opener, which says what to do with it instead."""
    from ..step_graph import SEARCH
    if given is Given.MODEL_DIR and not ModelDir.read(path).has(SEARCH):
        return CONCAT
    return INPLACE if device == "cpu" else DEVICE


def _model_dir(request: Request) -> ModelDir:
    """The ONNX Runtime backends' directory; whatever else was given is one line saying what to do instead."""
    model = request.path
    if request.given is Given.ENGINE_DIR:
        raise TfmExportError(f"{model}: holds TensorRT engines; run it with --backend tensorrt, or give the model "
                             "directory they were built from")
    if request.given is Given.CHECKPOINT:
        raise TfmExportError(f"{model}: is a checkpoint; the onnxruntime backend takes a model directory "
                             "(make one with `tfm-export onnx`), or use --backend torch")
    if request.given is Given.MODEL_SOURCE_DIR:
        raise TfmExportError(not_exported(model, "model directory", "translate with it directly (--backend torch)"))
    if request.vocab:
        raise TfmExportError("--vocab is only for checkpoints; a model directory carries its own tokenizer")
    model_dir = ModelDir.read(model)
    check_memory(model_dir)
    return model_dir


def check_memory(model_dir: ModelDir) -> None:
    """Before any session is opened: a model whose weights alone are more than this machine's memory is one line,
    not an out-of-memory kill minutes into loading it."""
    weights, total = model_dir.run_bytes(), total_memory_bytes()
    needed = weights + RUN_EXTRA_BYTES
    if total is not None and needed > total:
        raise TfmExportError(f"{model_dir.path}: translating with this model needs about {needed / 1e9:.1f} GB of "
                             f"memory ({weights / 1e9:.1f} GB of weights and {RUN_EXTRA_BYTES / 1e9:.1f} GB more), and "
                             f"this machine has {total / 1e9:.1f} GB; quantize it (tfm-export quantize --precision "
                             "int8) or run it on a larger machine")


def _opened(backend: StepBackend, source: ModelDir | EngineDir, limits: dict[str, int] | None = None) -> Opened:
    release_weight_pages(source)
    return Opened(LoopSearcher(backend), source.vocabulary(), source.config, source.rules, limits, backend, source)


def release_weight_pages(source: ModelDir | EngineDir) -> None:
    """The sessions are built: ONNX Runtime has packed what it packs, and the external weight files it mapped to do
    so (the directory's, its pre-packed graphs') need not stay resident (core.memory): a large model's decode then
    holds its weights about once, not twice. What the decode still reads comes back from the page cache."""
    released = release_file_pages([p for p in source.path.rglob("*.data") if p.is_file()])
    if released:
        log.info("%s: %.1f MB of mapped weights released after loading", source.path, released / 1e6)


def _on_device(request: Request) -> SessionOptions:
    require_device(request.options)
    return request.options


@register_backend(CONCAT)
def _concat(request: Request) -> Opened:
    """The contract's decoder_step, its logits reduced in NumPy. A loader given may run the graphs anywhere (the
    bls layout: native Triton models, for a model or an engine directory alike)."""
    from ...core.graph_spec import CONTRACT_GRAPHS, Graph, contract_specs
    from .concat import ConcatBackend
    from .loaders import open_contract_sessions
    options = _on_device(request)
    if request.loader is not None:
        source = EngineDir.read(request.path) if request.given is Given.ENGINE_DIR else ModelDir.read(request.path)
        specs = contract_specs(source.config)
        sessions = [request.loader(source.path / g.filename, specs[g], options, None) for g in CONTRACT_GRAPHS]
        return _opened(ConcatBackend(*sessions, source.config), source, source.limits)
    model_dir = _model_dir(request)
    sessions, shared = open_contract_sessions(model_dir, options)  # the tied table mapped once, for both sessions
    return _opened(ConcatBackend(sessions[Graph.ENCODER], sessions[Graph.DECODER_STEP], model_dir.config, model_dir,
                                 shared), model_dir)


@register_backend(INPLACE)
def _inplace(request: Request) -> Opened:
    """decoder_step_search (on the CPU its fused twin, where the directory has it) over IO binding, the cache in
    host buffers written in place."""
    from .decoder_step_search import load_decoder_step_search
    from .inplace import InPlaceBackend
    options = _on_device(request)
    model_dir = _model_dir(request)
    sessions = load_decoder_step_search(model_dir, options, request.loader or open_graph, request.step)
    return _opened(InPlaceBackend(sessions, request.step.cache_step), model_dir)


@register_backend(DEVICE)
def _device(request: Request) -> Opened:
    """decoder_step_search with all decode memory on the device (on the CPU: the GPU path rehearsed)."""
    from .decoder_step_search import load_decoder_step_search
    from .device import DeviceBackend
    options = _on_device(request)
    model_dir = _model_dir(request)
    sessions = load_decoder_step_search(model_dir, options, request.loader or open_graph, request.step,
                                        in_place=False)
    return _opened(DeviceBackend(sessions, request.step.cache_step, options.cuda_graphs), model_dir)


@register_backend(GENERATE)
def _generate(request: Request) -> Opened:
    """generate.onnx: the whole search in ONNX Runtime's BeamSearch op instead of the loop."""
    from .generate import load_generate
    options = _on_device(request)
    model_dir = _model_dir(request)
    return Opened(load_generate(model_dir, options), model_dir.vocabulary(), model_dir.config, model_dir.rules,
                  source=model_dir)


@register_backend(TENSORRT)
def _tensorrt(request: Request) -> Opened:
    from .tensorrt import open_engines
    if request.device != "cuda":
        raise TfmExportError("TensorRT engines run on the GPU; drop --device cpu (or use --backend onnxruntime)")
    if request.given is not Given.ENGINE_DIR:
        raise TfmExportError(f"{request.path}: is not a TensorRT engine directory; build one with `tfm-export trt "
                             "--model MODEL_DIR --output ENGINES`")
    if request.vocab:
        raise TfmExportError("--vocab is only for checkpoints; an engine directory carries its own tokenizer")
    engine_dir = EngineDir.read(request.path)  # the directory verified first, then what is missing here
    backend = open_engines(engine_dir)
    return _opened(backend, engine_dir, engine_dir.limits)


@register_backend(TORCH)
def _torch(request: Request) -> Opened:
    require_extra("export", "--backend torch")
    import torch  # only this backend needs PyTorch

    from ...model.loading import load_checkpoint
    from .reference import TorchBackend
    if request.given not in (Given.CHECKPOINT, Given.MODEL_SOURCE_DIR):
        article = "an" if request.given is Given.ENGINE_DIR else "a"
        raise TfmExportError(f"{request.path}: is {article} {request.given.value}; the torch backend takes a "
                             "checkpoint file or a Hugging Face model directory")
    if check_threads(request.options.intra_op_threads):
        torch.set_num_threads(int(request.options.intra_op_threads))
    if request.device == "cuda" and not torch.cuda.is_available():
        raise TfmExportError("--device cuda: PyTorch sees no CUDA GPU on this machine; use --device cpu")
    ckpt = load_checkpoint(request.path, list(request.vocab))
    backend = TorchBackend(ckpt.model, request.device)
    return Opened(LoopSearcher(backend), ckpt.vocab, ckpt.config, ckpt.rules, None, backend)


def graph_decoders(directory: Path, options: SessionOptions = DEFAULT_OPTIONS) -> dict[str, StepBackend]:
    """Every decoder a model directory has, by graph name, each opened through the door on its own so that each can
    be held to the reference: the contract's decoder_step, decoder_step_search, and its fused twin where this ONNX
    Runtime computes it right."""
    return dict(each_graph_decoder(directory, options))


def each_graph_decoder(directory: Path, options: SessionOptions = DEFAULT_OPTIONS
                       ) -> Iterator[tuple[str, StepBackend]]:
    """graph_decoders one at a time, each opened when the one before is let go: a large model's sessions, each with
    its own encoder, one pair at a time."""
    for name, opens in decoder_openers(directory, options).items():
        yield name, opens().backend


def decoder_openers(directory: Path, options: SessionOptions = DEFAULT_OPTIONS) -> dict[str, Callable[[], Opened]]:
    """What opens each of graph_decoders' decoders, by graph name: the concat backend for decoder_step, the in-place
    one for decoder_step_search and its fused twin."""
    from ...core.graph_spec import Graph
    from ..step_graph import FUSED, SEARCH, fused_usable
    model_dir = ModelDir.read(directory)
    wanted = {Graph.DECODER_STEP.value: (CONCAT, DEFAULT_STEP)}
    if model_dir.has(SEARCH):
        wanted[SEARCH.value] = (INPLACE, StepOptions(fused=False))
    if fused_usable(model_dir):
        wanted[FUSED.value] = (INPLACE, StepOptions(fused=True))
    return {name: functools.partial(open_backend, directory, backend, options, step=step)
            for name, (backend, step) in wanted.items()}
