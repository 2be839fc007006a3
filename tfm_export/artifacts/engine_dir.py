"""The TensorRT engine directory: `encoder.plan`, `decoder_step.plan`, `manifest.json`, the tokenizer.

Like a model directory it is self-describing (model config, special tokens, limits, tokenizer) and
written atomically; it adds what a plan is bound to (the target library and its version, the GPU
architecture), the optimisation profiles, the precision and the sha256 of the graphs each plan was built from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.config import ModelConfig
from ..core.graph_spec import Graph
from ..core.token_rules import TokenRules
from .manifest import (
    ENGINE_FORMAT,
    ENGINE_FORMAT_VERSION,
    MANIFEST,
    DirectoryKind,
    ModelDirError,
    is_file_hashes,
    is_object,
    is_positive,
    is_text,
    manifest_format,
    read_declared,
)
from .model_dir import ReadDirectory, check_model_fields, token_rules, verified_file
from .records import EngineManifest

# Which library builds and runs the plans. A plan loads only in the library (and version) that built it.
TENSORRT, RTX = "tensorrt", "rtx"
TARGET_NAMES = {TENSORRT: "TensorRT", RTX: "TensorRT-RTX"}


def plan_name(graph: Graph) -> str:
    return f"{graph.value}.plan"


def is_engine_dir(directory: Path) -> bool:
    """True when the directory's manifest says it holds engines (so `translate` can pick the backend)."""
    return manifest_format(directory) == ENGINE_FORMAT


REBUILD = "build the engines again with `tfm-export trt`"
ENGINE_DIR = DirectoryKind("engine directory", ENGINE_FORMAT, ENGINE_FORMAT_VERSION, REBUILD,
                           required=("model", "tokenizer.source", "tokenizer.target", "limits.max_batch",
                                     "limits.max_source_length", "limits.max_target_length", "precision",
                                     "tensorrt.target", "tensorrt.tensorrt", "engines", "files", "source",
                                     "special_tokens"),
                           checks={"model": is_object, "engines": is_object,
                                   "tensorrt.target": lambda v: isinstance(v, str) and v in TARGET_NAMES,
                                   "tensorrt.tensorrt": lambda v: is_text(v) and v.split(".")[0].isdigit(),
                                   "files": is_file_hashes, "limits.max_batch": is_positive,
                                   "limits.max_source_length": is_positive, "limits.max_target_length": is_positive,
                                   "int8": is_object})  # optional, checked where present


def read_engine_manifest(directory: Path) -> dict[str, Any]:
    """An engine directory's manifest as JSON, every field this tool reads checked. Readers take EngineDir.read's
    record."""
    return _checked(directory)[0].to_dict()


def _checked(directory: Path) -> tuple[EngineManifest, ModelConfig, TokenRules]:
    def wrong_format(declared: Any) -> str | None:
        return (f"{directory / MANIFEST}: not a {ENGINE_FORMAT} manifest (a model directory runs on --backend "
                "onnxruntime; build engines from it with `tfm-export trt`)")
    manifest = read_declared(directory, ENGINE_DIR, wrong_format)
    config = check_model_fields(manifest, directory / MANIFEST, REBUILD)
    return EngineManifest.from_dict(manifest), config, token_rules(manifest, directory / MANIFEST, REBUILD)


@dataclass(frozen=True)
class EngineDir(ReadDirectory):
    """An engine directory (TensorRT plans)."""

    manifest: EngineManifest
    _checked = staticmethod(_checked)

    @property
    def limits(self) -> dict[str, int]:
        """The rows and lengths the engines were built for: max_batch, max_source_length, max_target_length."""
        return {key: self.manifest.limits[key] for key in ("max_batch", "max_source_length", "max_target_length")}

    @property
    def target(self) -> str:
        """TENSORRT or RTX: the library the plans were built by (checked when read)."""
        return self.manifest.tensorrt["target"]

    @property
    def library_version(self) -> str:
        """The exact version of the library that built the plans, e.g. "10.3.0.30"."""
        return self.manifest.tensorrt["tensorrt"]

    def plan_path(self, graph: Graph | str) -> Path:
        """The plan file, inside the directory and checked against the manifest's sha256 (a swapped plan is
        refused, not run)."""
        name = getattr(graph, "value", graph)
        entry = self.manifest.engines.get(name)
        if not isinstance(entry, dict):
            raise ModelDirError(f"{self.path / MANIFEST}: lists no {name} engine; {REBUILD}")
        return verified_file(self.path, entry.get("file"), entry.get("sha256"), f"{name} engine", REBUILD)
