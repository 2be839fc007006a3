"""The TensorRT engine directory: `encoder.plan`, `decoder_step.plan`, `manifest.json`, the tokenizer.

Like a model directory it is self-describing (model config, special tokens, limits, tokenizer) and
written atomically; it adds what a plan is bound to (TensorRT version, GPU architecture), the
optimisation profiles, the precision and the sha256 of the graphs each plan was built from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import TfmExportError
from .files import file_sha256
from .graph_spec import Graph

ENGINE_FORMAT = "tfm-export-engines"
ENGINE_FORMAT_VERSION = 1
MANIFEST = "manifest.json"
REQUIRED = ("model", "tokenizer", "limits", "precision", "tensorrt", "engines", "source")


def plan_name(graph: Graph) -> str:
    return f"{graph.value}.plan"


def is_engine_dir(directory: Path) -> bool:
    """True when the directory's manifest says it holds engines (so `translate` can pick the backend)."""
    try:
        return json.loads((directory / MANIFEST).read_text(encoding="utf-8")).get("format") == ENGINE_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read_engine_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    if not directory.is_dir():
        raise TfmExportError(f"{directory}: engine directory not found; build one with `tfm-export trt`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TfmExportError(f"{path}: missing; this is not a tfm-export engine directory") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TfmExportError(f"{path}: unreadable manifest ({exc}); build the engines again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != ENGINE_FORMAT:
        raise TfmExportError(f"{path}: not a {ENGINE_FORMAT} manifest (a model directory runs on --backend "
                             "onnxruntime; build engines from it with `tfm-export trt`)")
    if manifest.get("format_version") != ENGINE_FORMAT_VERSION:
        raise TfmExportError(f"{path}: engine format version {manifest.get('format_version')} is not supported "
                             f"(this tool reads {ENGINE_FORMAT_VERSION}); build the engines again")
    missing = [key for key in REQUIRED if key not in manifest]
    if missing:
        raise TfmExportError(f"{path}: lacks {', '.join(missing)}; build the engines again")
    return manifest


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
