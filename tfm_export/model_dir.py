"""The exported model directory: staged writes with an atomic rename, the manifest, and reading it back.

A directory either is complete (manifest.json last) or does not exist under its final name: files
are written into a hidden sibling and renamed into place, so an interrupted export leaves nothing
that looks like a model.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import TfmExportError
from .files import file_sha256

MANIFEST = "manifest.json"
FORMAT_NAME = "tfm-export-model"
FORMAT_VERSION = 1


class ModelDirError(TfmExportError):
    """A model directory that cannot be written or read."""


def check_output(output: Path, force: bool, keep: tuple[Path, ...] = ()) -> None:
    """Fail before any slow work if the output cannot be written, or replacing it would delete `keep`
    (the inputs of the export, or the working directory)."""
    target = output.resolve()
    for path in keep:
        if path.resolve() == target:
            raise ModelDirError(f"{output}: is the input itself ({path}); choose another --output")
        if target in path.resolve().parents:
            raise ModelDirError(f"{output}: holds {path}, which replacing it would delete; choose another --output")
        if path.is_dir() and path.resolve() in target.parents:
            raise ModelDirError(f"{output}: is inside the input {path}; choose an --output outside it")
    cwd = Path.cwd().resolve()
    if cwd == target or target in cwd.parents:
        raise ModelDirError(f"{output}: holds the working directory {cwd}, which replacing it would delete; choose "
                            "another --output")
    if output.exists() and not output.is_dir():
        raise ModelDirError(f"{output}: exists and is not a directory; choose another --output")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise ModelDirError(f"{output}: directory is not empty; pass --force to replace it "
                            "or choose another --output")
    parent = output.resolve().parent
    if not parent.is_dir():
        raise ModelDirError(f"{parent}: parent directory of --output does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ModelDirError(f"{parent}: not writable; choose a writable --output")


@contextlib.contextmanager
def staged_directory(output: Path, force: bool, keep: tuple[Path, ...] = ()) -> Iterator[Path]:
    """Yield a hidden staging directory beside `output`; on success it replaces `output` atomically."""
    check_output(output, force, keep)
    parent = output.resolve().parent
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".partial", dir=parent))
    except OSError as exc:
        raise ModelDirError(f"{parent}: cannot create the output ({exc.strerror}); "
                            "choose a writable --output") from None
    try:
        yield staging
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private; a model directory is meant to be shared
        _swap_into_place(staging, output.resolve())
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _swap_into_place(staging: Path, output: Path) -> None:
    old = None
    try:
        if output.exists():
            old = output.with_name(f".{output.name}.old-{os.getpid()}")
            os.replace(output, old)
        os.replace(staging, output)
    except OSError as exc:
        if old is not None and not output.exists():
            os.replace(old, output)  # put the previous directory back
        raise ModelDirError(f"{output}: cannot replace it ({exc.strerror}); choose another --output") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_manifest(directory: Path) -> dict[str, Any]:
    if not directory.exists():
        raise ModelDirError(f"{directory}: model directory not found; export one with `tfm-export onnx`")
    if not directory.is_dir():
        raise ModelDirError(f"{directory}: is a file, not a model directory; make one with `tfm-export onnx "
                            "--checkpoint FILE --output DIR` (tfm-run translate also takes checkpoints)")
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelDirError(f"{path}: missing; this is not a tfm-export model directory") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelDirError(f"{path}: unreadable manifest ({exc}); export the model again") from None
    if isinstance(manifest, dict) and manifest.get("format") == "tfm-export-engines":
        raise ModelDirError(f"{directory}: holds TensorRT engines, not ONNX graphs; run it with `tfm-run translate "
                            "--model DIR`, or give the model directory they were built from")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise ModelDirError(f"{path}: not a {FORMAT_NAME} manifest; export the model with `tfm-export onnx`")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ModelDirError(f"{path}: format version {manifest.get('format_version')} is not supported "
                            f"(this tool reads {FORMAT_VERSION}); upgrade tfm-export or export again")
    missing = [key for key in REQUIRED_KEYS if not _has(manifest, key)]
    if missing:
        raise ModelDirError(f"{path}: lacks {', '.join(missing)}; export the model again")
    wrong = [key for key, ok in _TYPE_CHECKS.items() if not ok(_get(manifest, key))]
    if wrong:
        raise ModelDirError(f"{path}: has an invalid {', '.join(wrong)}; export the model again")
    return manifest


REQUIRED_KEYS = ("model", "tokenizer.source", "tokenizer.target", "limits.max_source_length", "precision", "opset",
                 "graphs.encoder.file", "graphs.encoder.sha256", "graphs.decoder_step.file",
                 "graphs.decoder_step.sha256", "source_checkpoint.sha256", "optimizations")


PRECISIONS = ("fp32", "fp16", "int8")
_file_name = lambda v: isinstance(v, str) and v != "" and Path(v).name == v  # noqa: E731
_TYPE_CHECKS = {
    "precision": lambda v: v in PRECISIONS,
    "optimizations": lambda v: isinstance(v, list),
    "tokenizer.source": _file_name, "tokenizer.target": _file_name,
    "graphs.encoder.file": _file_name, "graphs.decoder_step.file": _file_name,
    "limits.max_source_length": lambda v: isinstance(v, int) and v > 0,
}


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


def load_graph(directory: Path, manifest: dict[str, Any], graph: str, external_data: bool = True):
    """The graph's ModelProto (sha256 checked); a file that does not parse is one line, not a protobuf trace."""
    import onnx
    path = graph_path(directory, manifest, graph)
    try:
        return onnx.load_model(str(path), load_external_data=external_data)
    except Exception as exc:  # protobuf DecodeError, onnx's own errors, OSError for external data
        raise ModelDirError(f"{path}: not a readable ONNX graph ({type(exc).__name__}); export the model again") \
            from None


def graph_path(directory: Path, manifest: dict[str, Any], graph: str, check_hash: bool = True) -> Path:
    """The graph's file, checked against the manifest's sha256 (a swapped or damaged file is refused)."""
    entry = manifest["graphs"][graph]
    path = directory / entry["file"]
    if not path.is_file():
        raise ModelDirError(f"{path}: graph file missing from the model directory; export the model again")
    if check_hash and file_sha256(path) != entry["sha256"]:
        raise ModelDirError(f"{path}: sha256 differs from manifest.json (file changed or damaged); "
                            "export the model again")
    return path


def tokenizer_file(directory: Path, name: str) -> Path:
    """A tokenizer file the manifest names: a plain file name inside the directory, present."""
    path = directory / name
    if Path(name).name != name or not path.is_file():
        raise ModelDirError(f"{directory / 'manifest.json'}: tokenizer file {name!r} is not a file in the model "
                            "directory; export the model again")
    return path
