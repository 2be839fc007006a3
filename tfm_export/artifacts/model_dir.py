"""The exported model directory: its manifest, written and read back with every field checked, and the
files it names (graphs checked against their sha256, tokenizers inside the directory).

Directories are written through `staging` (hidden sibling, atomic rename), so one either is complete
(manifest.json last) or does not exist under its final name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.files import file_sha256
from ..core.tokenizer import Vocabulary, load_tokenizer
from .manifest import (
    ENGINE_FORMAT,
    MANIFEST,
    MODEL_FORMAT,
    MODEL_FORMAT_VERSION,
    DirectoryKind,
    ModelDirError,
    read_declared,
)

PRECISIONS = ("fp32", "fp16", "int8")
INT8_MODES = ("static", "dynamic")  # manifest int8.mode: calibrated Q/DQ graphs, or run-time activation ranges
_file_name = lambda v: isinstance(v, str) and v != "" and Path(v).name == v  # noqa: E731
MODEL_DIR = DirectoryKind(
    "model directory", MODEL_FORMAT, MODEL_FORMAT_VERSION, "export the model again with `tfm-export onnx`",
    required=("model", "tokenizer.source", "tokenizer.target", "limits.max_source_length", "precision", "opset",
              "graphs.encoder.file", "graphs.encoder.sha256", "graphs.decoder_step.file",
              "graphs.decoder_step.sha256", "source_checkpoint.sha256", "optimizations"),
    checks={"precision": lambda v: v in PRECISIONS,
            "optimizations": lambda v: isinstance(v, list),
            "tokenizer.source": _file_name, "tokenizer.target": _file_name,
            "graphs.encoder.file": _file_name, "graphs.decoder_step.file": _file_name,
            "limits.max_source_length": lambda v: isinstance(v, int) and v > 0})


def read_manifest(directory: Path) -> dict[str, Any]:
    """A model directory's manifest (an engine directory is named as such: it runs, but is no model)."""
    def wrong_format(declared: Any) -> str | None:
        if declared == ENGINE_FORMAT:
            return (f"{directory}: holds TensorRT engines, not ONNX graphs; run it with `tfm-run translate "
                    "--model DIR`, or give the model directory they were built from")
        return None
    return read_declared(directory, MODEL_DIR, wrong_format)


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
        raise ModelDirError(f"{directory / MANIFEST}: tokenizer file {name!r} is not a file in the model "
                            "directory; export the model again")
    return path


def load_vocabulary(directory: Path, manifest: dict[str, Any]) -> Vocabulary:
    """The tokenizers a model or engine directory carries, checked against the vocabulary sizes of its graphs."""
    files, model = manifest["tokenizer"], manifest["model"]
    source = load_tokenizer(tokenizer_file(directory, files["source"]))
    target = source if files["target"] == files["source"] else load_tokenizer(tokenizer_file(directory,
                                                                                             files["target"]))
    for tok, size in ((source, model["src_vocab_size"]), (target, model["trg_vocab_size"])):
        if tok.vocab_size != size:
            raise ModelDirError(f"{tok.origin}: has {tok.vocab_size} tokens but the graphs take {size}; "
                                "this tokenizer does not belong to these graphs")
    return Vocabulary(source, target)
