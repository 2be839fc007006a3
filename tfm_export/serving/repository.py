"""`tfm-export triton`: a self-contained Triton model repository from a model or engine directory.

    translator layout                      bls layout
    REPO/NAME/config.pbtxt                 REPO/NAME/config.pbtxt            Python BLS model: the decoding loop
    REPO/NAME/1/model.py                   REPO/NAME/1/model.py
    REPO/NAME/1/model/   (the directory)   REPO/NAME/1/model/                manifest.json and tokenizer only
                                           REPO/NAME_encoder/config.pbtxt, 1/encoder.onnx (or .plan)
                                           REPO/NAME_decoder_step/config.pbtxt, 1/decoder_step.onnx (or .plan)

Paths inside are relative, so the repository can be copied, mounted or uploaded anywhere. Every input is
checked (graph and plan sha256 included) before anything is written, and the repository is staged and
renamed into place like every other artifact directory.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..artifacts.engine_dir import RTX, EngineDir
from ..artifacts.manifest import (
    ENGINE_FORMAT,
    MANIFEST,
    REPOSITORY_FORMAT,
    REPOSITORY_FORMAT_VERSION,
    ModelDirError,
    manifest_format,
    write_manifest,
)
from ..artifacts.model_dir import ModelDir
from ..artifacts.staging import staged_directory
from ..core.graph_spec import CONTRACT_GRAPHS, Graph
from .contract import DEFAULT_MAX_BATCH, DEFAULT_NAME, DEVICES, LAYOUTS, native_graphs
from .model_config import Deployment, native_model, python_model

VERSION = "1"  # the one model version written
MODEL_SUBDIR = "model"  # the model directory's copy inside the version directory
MODEL_PY = '''"""Triton Python-backend model written by `tfm-export triton`. The work is done by tfm_export (the
runtime-only install is enough: `pip install tfm-export`), configured by this model's config.pbtxt."""

from tfm_export.serving.triton_model import TritonPythonModel  # noqa: F401
'''


@dataclass(frozen=True)
class RepositoryRequest:
    model: Path  # a model directory (tfm-export onnx/quantize) or an engine directory (tfm-export trt)
    output: Path
    name: str = DEFAULT_NAME
    layout: str = "translator"
    max_batch: int | None = None  # default: the engines' profile, else DEFAULT_MAX_BATCH
    instances: int = 1
    device: str | None = None  # default: gpu for engines, cpu otherwise
    force: bool = False


@dataclass(frozen=True)
class Repository:
    models: tuple[str, ...]  # the text model first
    deployment: Deployment


@dataclass(frozen=True)
class _Source:
    view: ModelDir | EngineDir

    @property
    def engines(self) -> bool:
        return isinstance(self.view, EngineDir)

    @property
    def directory(self) -> Path:
        return self.view.path

    @property
    def graph_names(self) -> list[str]:
        """Every graph the directory lists (engine directories hold the contract's two)."""
        return [g.value for g in CONTRACT_GRAPHS] if self.engines else list(self.view.graphs)

    def graph_files(self, graph: str) -> list[Path]:
        """The graph with its external weights (a large model's graphs share one file), or the plan; checked
        against the manifest's sha256 (a model directory's every file at once, by checked_graphs)."""
        if self.engines:
            return [self.view.plan_path(Graph(graph))]
        entry = self.view.entry(graph)
        data = self.directory / entry.data_file
        return [self.directory / entry.file, *([data] if data.is_file() else [])]

    def check_graphs(self) -> None:
        """Every graph file of a model directory, each once, against the manifest (plans: as they are listed)."""
        if not self.engines:
            self.view.verified_graphs()

    def tokenizer_files(self) -> list[Path]:
        """The tokenizer file(s), checked against the manifest's sha256."""
        return sorted({self.view.tokenizer_file(side) for side in ("source", "target")})


def write_repository(request: RepositoryRequest) -> Repository:
    """Check everything, then write the repository in one staged step."""
    _check_request(request)
    source = _read_source(request.model)
    deployment = _deployment(request, source)
    _check_layout(request, source, deployment)
    files = _files(request, source, deployment)
    models = (request.name,) if request.layout == "translator" else (request.name, *_native_names(request.name))
    with staged_directory(request.output, request.force, keep=(request.model,)) as staging:
        for relative, content in files.items():
            (staging / relative).parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copyfile(content, staging / relative)
            else:
                (staging / relative).write_text(content, encoding="utf-8")
        write_manifest(staging, {"format": REPOSITORY_FORMAT, "format_version": REPOSITORY_FORMAT_VERSION,
                                 "tool_version": __version__, "layout": request.layout, "models": list(models),
                                 "source_sha256": {g.value: sha256 for g, sha256 in _graph_hashes(source)}})
    return Repository(models, deployment)


def _graph_hashes(source: _Source) -> list[tuple[Graph, object]]:
    """The sha256 of the contract's graphs (or of their plans) as the source's manifest records them."""
    if source.engines:
        return [(g, source.view.manifest.engines[g.value].get("sha256")) for g in CONTRACT_GRAPHS]
    return [(g, source.view.entry(g).sha256) for g in CONTRACT_GRAPHS]


def _check_request(request: RepositoryRequest) -> None:
    if request.layout not in LAYOUTS:
        raise ModelDirError(f"unknown layout {request.layout!r}; choose one of {', '.join(LAYOUTS)}")
    if request.device not in (None, *DEVICES):
        raise ModelDirError(f"unknown device {request.device!r}; choose one of {', '.join(DEVICES)}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", request.name):
        raise ModelDirError(f"--name {request.name!r}: use letters, digits, '_' and '-' (it names the model's "
                            "directory and appears in request URLs)")
    if request.instances < 1 or (request.max_batch is not None and request.max_batch < 1):
        raise ModelDirError("--instances and --max-batch must be at least 1")


def _read_source(path: Path) -> _Source:
    if path.is_dir() and manifest_format(path) == ENGINE_FORMAT:
        return _Source(EngineDir.read(path))
    return _Source(ModelDir.read(path))  # every other case is ModelDir.read's one-line error


def _deployment(request: RepositoryRequest, source: _Source) -> Deployment:
    device = request.device or ("gpu" if source.engines else "cpu")
    if source.engines and device == "cpu":
        raise ModelDirError(f"{source.directory}: holds TensorRT engines, which run only on a GPU; drop --device cpu, "
                            "or give the model directory they were built from")
    limit = source.view.limits["max_batch"] if source.engines else None
    max_batch = request.max_batch or limit or DEFAULT_MAX_BATCH
    if limit is not None and max_batch > limit:
        raise ModelDirError(f"--max-batch {max_batch} exceeds the engines' profile ({limit} rows); lower it, or "
                            "rebuild the engines with a larger --max-batch")
    return Deployment(max_batch, request.instances, device)


def _check_layout(request: RepositoryRequest, source: _Source, deployment: Deployment) -> None:
    """What the native backends cannot run as the runtime does. Triton's onnxruntime backend has no setting to run
    int8 static (Q/DQ) graphs with their weights dequantized once, so on x86 CPUs it would run them ~15x slower
    than fp32; the translator layout runs them as `tfm-run` does."""
    if request.layout == "bls" and source.engines and source.view.target == RTX:
        raise ModelDirError(f"{source.directory}: TensorRT-RTX engines; Triton's TensorRT backend loads TensorRT "
                            "plans only: use --layout translator (it runs them through tfm-export's runtime)")
    static = not source.engines and source.view.int8_mode == "static"
    if request.layout == "bls" and static and deployment.device == "cpu":
        raise ModelDirError(f"{source.directory}: int8 static (Q/DQ) graphs; Triton's onnxruntime backend cannot "
                            "run them with their weights dequantized once, which makes them ~15x slower than fp32 "
                            "on CPUs: use --layout translator, or an int8 dynamic directory")


def _native_names(name: str) -> tuple[str, str]:
    return tuple(f"{name}_{g.value}" for g in CONTRACT_GRAPHS)


def _files(request: RepositoryRequest, source: _Source, deployment: Deployment) -> dict[Path, Path | str]:
    """Every file of the repository: a source file to copy, or generated text."""
    name, version = Path(request.name), Path(request.name) / VERSION
    copied = [source.directory / MANIFEST, *source.tokenizer_files()]
    # every graph is checked, the optional ones (decoder_step_search, older directories' retired ones) included,
    # whichever the layout copies: a damaged directory is refused whole, as the runtime refuses it
    source.check_graphs()
    graph_files = {name: source.graph_files(name) for name in source.graph_names}
    if request.layout == "translator":  # the copied manifest lists them all, and the runtime uses them
        copied += [p for paths in graph_files.values() for p in paths]
    files: dict[Path, Path | str] = {version / MODEL_SUBDIR / p.name: p for p in copied}
    files[version / "model.py"] = MODEL_PY
    parameters = {"layout": request.layout, "device": deployment.device, "model_directory": MODEL_SUBDIR,
                  "tool_version": __version__}
    if request.layout == "bls":
        graphs = native_graphs(source.view)
        for graph, native in zip(CONTRACT_GRAPHS, _native_names(request.name), strict=True):
            parameters[f"{graph.value}_model"] = native
            paths = graph_files[graph.value]
            files |= {Path(native) / VERSION / p.name: p for p in paths}
            files[Path(native) / "config.pbtxt"] = native_model(native, graphs[graph], deployment, paths[0].name,
                                                                source.engines)
    files[name / "config.pbtxt"] = python_model(request.name, deployment, parameters)
    return files
