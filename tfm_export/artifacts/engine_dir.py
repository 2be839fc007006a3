"""The TensorRT engine directory: `encoder.plan`, `decoder_step.plan`, `manifest.json`, the tokenizer.

Like a model directory it is self-describing (model config, special tokens, limits, tokenizer) and
written atomically; it adds what a plan is bound to (TensorRT version, GPU architecture), the
optimisation profiles, the precision and the sha256 of the graphs each plan was built from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import TfmExportError
from ..core.files import file_sha256
from ..core.graph_spec import Graph
from .manifest import ENGINE_FORMAT, ENGINE_FORMAT_VERSION, MANIFEST, DirectoryKind, manifest_format, read_declared


def plan_name(graph: Graph) -> str:
    return f"{graph.value}.plan"


def is_engine_dir(directory: Path) -> bool:
    """True when the directory's manifest says it holds engines (so `translate` can pick the backend)."""
    return manifest_format(directory) == ENGINE_FORMAT


ENGINE_DIR = DirectoryKind("engine directory", ENGINE_FORMAT, ENGINE_FORMAT_VERSION,
                           "build the engines again with `tfm-export trt`",
                           required=("model", "tokenizer", "limits", "precision", "tensorrt", "engines", "source"))


def read_engine_manifest(directory: Path) -> dict[str, Any]:
    def wrong_format(declared: Any) -> str | None:
        return (f"{directory / MANIFEST}: not a {ENGINE_FORMAT} manifest (a model directory runs on --backend "
                "onnxruntime; build engines from it with `tfm-export trt`)")
    return read_declared(directory, ENGINE_DIR, wrong_format)


def plan_path(directory: Path, manifest: dict[str, Any], graph: Graph) -> Path:
    """The plan file, checked against the manifest's sha256 (a swapped plan is refused, not run)."""
    entry = manifest["engines"].get(graph.value, {})
    path = directory / entry.get("file", plan_name(graph))
    if not path.is_file():
        raise TfmExportError(f"{path}: engine file missing; build the engines again with `tfm-export trt`")
    if file_sha256(path) != entry.get("sha256"):
        raise TfmExportError(f"{path}: sha256 differs from manifest.json (file changed or damaged, or from another "
                             "build); build the engines again with `tfm-export trt`")
    return path
