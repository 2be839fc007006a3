"""What every artifact directory shares: the manifest's file name, the formats it may declare, and how
a manifest is written and read back with its required fields checked."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import TfmExportError
from ..core.files import is_sha256, read_json
from .records import Record

MANIFEST = "manifest.json"
HF_CONFIG_FILE = "config.json"  # what marks a Hugging Face model directory
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".chkpt", ".ckpt")  # what PyTorch training scripts name their checkpoints
EXPORT_HINT = "`tfm-export onnx --checkpoint {} --output MODEL_DIR`"


class ModelDirError(TfmExportError):
    """A model or engine directory that cannot be written or read."""


@dataclass(frozen=True)
class DirectoryKind:
    """One kind of artifact directory: the format its manifest declares and what it must hold."""

    what: str  # "model directory"
    format: str
    version: int
    remake: str  # what to do about a damaged one
    required: tuple[str, ...]  # dotted keys
    # dotted key -> valid value? (a required key always, an optional one where present)
    checks: dict[str, Callable[[Any], bool]] = field(default_factory=dict)


def is_positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def is_text(value: Any) -> bool:
    return isinstance(value, str)


def is_object(value: Any) -> bool:
    return isinstance(value, dict)


def is_file_hashes(value: Any) -> bool:
    """A manifest's `files`: each file name with its sha256."""
    return isinstance(value, dict) and all(is_text(k) and is_sha256(h) for k, h in value.items())


# Version 2: `files` records the sha256 of every file besides graphs and plans (tokenizers, external weights).
MODEL_FORMAT, MODEL_FORMAT_VERSION = "tfm-export-model", 2
# Engines version 3: `tensorrt.target` names the library that built the plans (TensorRT or TensorRT-RTX).
ENGINE_FORMAT, ENGINE_FORMAT_VERSION = "tfm-export-engines", 3
# A Triton model repository (tritonserver reads only its subdirectories; the manifest marks the repository ours).
REPOSITORY_FORMAT, REPOSITORY_FORMAT_VERSION = "tfm-export-triton-repository", 1
# Hugging Face's layout of a model directory (`tfm-export hf`): their files, and this manifest to say it is ours.
HF_VIEW_FORMAT, HF_VIEW_FORMAT_VERSION = "tfm-export-hf-layout", 1


def is_hf_directory(path: Path) -> bool:
    return path.is_dir() and (path / HF_CONFIG_FILE).is_file()


def checkpoint_inside(directory: Path) -> Path | None:
    """The checkpoint file a directory holds (ckpt.pt first), for the error that names it."""
    try:
        found = sorted(p for p in directory.iterdir() if p.suffix in CHECKPOINT_SUFFIXES and p.is_file())
    except OSError:
        return None
    return next((p for p in found if p.name == "ckpt.pt"), found[0] if found else None)


def not_exported(directory: Path, what: str, run_as_is: str = "") -> str:
    """Why a directory without a manifest is no tfm-export `what`, and the fix: a Hugging Face directory or a
    checkpoint's directory is exported first (or, where the command can, `run_as_is` with it as it is)."""
    if is_hf_directory(directory):
        return (f"{directory}: is a Hugging Face model directory, not a tfm-export {what}; export it with "
                + EXPORT_HINT.format(directory) + (f", or {run_as_is}" if run_as_is else ""))
    checkpoint = checkpoint_inside(directory)
    if checkpoint is not None:
        return (f"{directory}: holds the checkpoint {checkpoint}, not a tfm-export {what}; export it with "
                + EXPORT_HINT.format(checkpoint) + (f", or give {checkpoint} itself" if run_as_is else ""))
    return f"{directory / MANIFEST}: missing; this is not a tfm-export {what}"


def write_manifest(directory: Path, manifest: dict[str, Any] | Record) -> None:
    """manifest: a record (records.py), or the JSON of a format without one (a Triton repository's)."""
    data = manifest.to_dict() if isinstance(manifest, Record) else manifest
    (directory / MANIFEST).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def manifest_format(directory: Path) -> str | None:
    """The format a directory's manifest declares, or None when there is no readable manifest."""
    try:
        data = read_json(directory / MANIFEST, ModelDirError, "")
    except (OSError, ModelDirError):
        return None
    return data.get("format") if isinstance(data, dict) else None


def read_declared(directory: Path, kind: DirectoryKind, wrong_format: Callable[[Any], str | None]) -> dict[str, Any]:
    """The manifest of a `kind` directory; every way it can be absent or damaged is one line.
    wrong_format(declared format) says what a directory of another format is for (or None)."""
    if not directory.exists():
        raise ModelDirError(f"{directory}: {kind.what} not found; {kind.remake}")
    if not directory.is_dir():
        raise ModelDirError(f"{directory}: is a file, not a {kind.what}; {kind.remake}")
    path = directory / MANIFEST
    try:
        manifest = read_json(path, ModelDirError, kind.remake)
    except FileNotFoundError:
        raise ModelDirError(not_exported(directory, kind.what)) from None
    declared = manifest.get("format") if isinstance(manifest, dict) else None
    if declared != kind.format:
        raise ModelDirError(wrong_format(declared) or f"{path}: not a {kind.format} manifest; {kind.remake}")
    if manifest.get("format_version") != kind.version:
        raise ModelDirError(f"{path}: format version {manifest.get('format_version')} is not supported (this tool "
                            f"reads {kind.version}); upgrade tfm-export, or {kind.remake}")
    missing = [key for key in kind.required if not _has(manifest, key)]
    if missing:
        raise ModelDirError(f"{path}: lacks {', '.join(missing)}; {kind.remake}")
    wrong = [key for key, ok in kind.checks.items() if _has(manifest, key) and not ok(_get(manifest, key))]
    if wrong:
        raise ModelDirError(f"{path}: has an invalid {', '.join(wrong)}; {kind.remake}")
    return manifest


def _get(manifest: dict[str, Any], dotted: str) -> Any:
    node: Any = manifest
    for part in dotted.split("."):
        node = node[part]
    return node


def _has(manifest: dict[str, Any], dotted: str) -> bool:
    node: Any = manifest
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True
