"""The exported model directory: its manifest, written and read back with every field checked, and the
files it names (graphs checked against their sha256, tokenizers inside the directory).

Directories are written through `staging` (hidden sibling, atomic rename), so one either is complete
(manifest.json last) or does not exist under its final name.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..core.config import SIZE_LIMITS, ModelConfig
from ..core.errors import TfmExportError
from ..core.files import contained_file, file_sha256
from ..core.graph_spec import RETIRED_GRAPHS, Graph, all_specs
from ..core.machine import HASH_THREADS
from ..core.token_rules import SEED_RULES, TokenRules, is_token_id
from ..core.tokenizer import SENTENCEPIECE_INPUTS, SPECIAL_IDS, Vocabulary, load_tokenizer
from .manifest import (
    ENGINE_FORMAT,
    MANIFEST,
    MODEL_FORMAT,
    MODEL_FORMAT_VERSION,
    DirectoryKind,
    ModelDirError,
    is_file_hashes,
    is_object,
    is_positive,
    is_sha256,
    is_text,
    read_declared,
)
from .records import DATA_KEY, SENTENCEPIECE, SHARED, TOKEN_RULES, GraphEntry, ModelManifest

__all__ = ["DATA_KEY", "SENTENCEPIECE", "SHARED", "TOKEN_RULES"]  # the JSON keys, for tests that read it raw

WEIGHTS_FILE = "weights.onnx.data"  # DATA_KEY of every graph in the external layout
SHARED_MIN_BYTES = 256  # smaller ones (folded scalars, shapes) stay inline
SHARED_DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8"}  # the shared table's type, by precision
EMBEDDING_MIN_ELEMENTS = 4096  # int8 stores Gather tables this large int8; smaller ones (positions, shapes) stay float
FLOAT_EMBEDDINGS = "float (--float-embeddings)"  # an int8 manifest's int8.embeddings when every table stayed float
PRECISIONS = ("fp32", "fp16", "int8")
INT8_MODES = ("static", "dynamic")  # manifest int8.mode: calibrated Q/DQ graphs, or run-time activation ranges
REMAKE = "export the model again with `tfm-export onnx`"
MODEL_DIR = DirectoryKind(
    "model directory", MODEL_FORMAT, MODEL_FORMAT_VERSION, REMAKE,
    required=("model", "tokenizer.source", "tokenizer.target", "limits.max_source_length",
              "limits.max_target_length", "special_tokens", "precision", "opset", "graphs.encoder.file",
              "graphs.encoder.sha256", "graphs.decoder_step.file", "graphs.decoder_step.sha256", "files",
              "source_checkpoint.sha256", "optimizations"),
    checks={"model": is_object, "precision": lambda v: v in PRECISIONS,
            "opset": is_positive, "optimizations": lambda v: isinstance(v, list) and all(map(is_text, v)),
            "tokenizer.source": is_text, "tokenizer.target": is_text,
            "graphs.encoder.file": is_text, "graphs.decoder_step.file": is_text,
            "graphs.encoder.sha256": is_sha256, "graphs.decoder_step.sha256": is_sha256, "files": is_file_hashes,
            "limits.max_source_length": is_positive, "limits.max_target_length": is_positive,
            "special_tokens": lambda v: isinstance(v, dict) and all(map(is_token_id, v.values())),
            "source_checkpoint.sha256": is_sha256,
            # optional, checked where present (verify checks `parent` itself, saying what it must hold)
            "source_checkpoint.file": is_text, "source_checkpoint.model_type": is_text, "int8": is_object,
            "optimizations_not_applied": is_object, "sentencepiece": is_object, "sentencepiece.file": is_text,
            "sentencepiece.input": lambda v: v in SENTENCEPIECE_INPUTS})


def read_manifest(directory: Path) -> dict[str, Any]:
    """A model directory's manifest as JSON, every field this tool reads checked (an engine directory is named as
    such: it runs, but is no model). Readers take ModelDir.read's record."""
    return _checked(directory)[0].to_dict()


def _checked(directory: Path) -> tuple[ModelManifest, ModelConfig, TokenRules]:
    def wrong_format(declared: Any) -> str | None:
        if declared == ENGINE_FORMAT:
            return (f"{directory}: holds TensorRT engines, not ONNX graphs; run it with `tfm-run translate "
                    "--model DIR`, or give the model directory they were built from")
        return None
    manifest = read_declared(directory, MODEL_DIR, wrong_format)
    config = check_model_fields(manifest, directory / MANIFEST, REMAKE)
    rules = token_rules(manifest, directory / MANIFEST, REMAKE)
    graphs = manifest["graphs"]
    known = {g.value for g in all_specs(config)} | set(RETIRED_GRAPHS)  # the optional graphs too
    for name, entry in graphs.items():  # the optional graphs (decoder_step_search) are held to the same form
        if name not in known or not isinstance(entry, dict) or not is_text(entry.get("file")) \
                or not is_sha256(entry.get("sha256")) or (DATA_KEY in entry and not is_text(entry[DATA_KEY])):
            raise ModelDirError(f"{directory / MANIFEST}: has an invalid graphs.{name}; {REMAKE}")
    files = [entry["file"] for entry in graphs.values()]
    twice = next((f for f in files if files.count(f) > 1), None)
    if twice is not None:
        raise ModelDirError(f"{directory / MANIFEST}: names {twice!r} for two graphs; {REMAKE}")
    if manifest["precision"] == "int8" and manifest.get("int8", {}).get("mode") not in INT8_MODES:
        raise ModelDirError(f"{directory / MANIFEST}: int8.mode must be one of {', '.join(INT8_MODES)}; {REMAKE}")
    return ModelManifest.from_dict(manifest), config, rules


def check_model_fields(manifest: dict[str, Any], path: Path, remake: str) -> ModelConfig:
    """The model config and the length limits a model or engine manifest declares, consistent with each other.
    The sizes the graphs were built with must be there: a default would describe some other model."""
    missing = [f"model.{key}" for key in SIZE_LIMITS if key not in manifest["model"]]
    if missing:
        raise ModelDirError(f"{path}: lacks {', '.join(missing)}; {remake}")
    try:
        config = ModelConfig.from_dict(manifest["model"])
    except TfmExportError as exc:
        raise ModelDirError(f"{path}: {exc}; {remake}") from None
    limits = manifest["limits"]
    for key in ("max_source_length", "max_target_length"):
        if not 1 <= limits[key] <= config.n_position:
            raise ModelDirError(f"{path}: limits.{key} {limits[key]} is outside 1..{config.n_position} (the model's "
                                f"positions); {remake}")
    return config


def token_rules(manifest: dict[str, Any], path: Path, remake: str = REMAKE) -> TokenRules:
    """The ids and length default decoding follows: the manifest's token_rules, or the seed's layout (whose
    special_tokens must then be the seed's)."""
    if TOKEN_RULES not in manifest:
        if manifest["special_tokens"] != SPECIAL_IDS:
            raise ModelDirError(f"{path}: special_tokens differ from the seed layout {SPECIAL_IDS} and no "
                                f"{TOKEN_RULES} say what they are; {remake}")
        return SEED_RULES
    try:
        return TokenRules.from_dict(manifest[TOKEN_RULES], manifest["model"]["trg_vocab_size"])
    except TfmExportError as exc:
        raise ModelDirError(f"{path}: {exc}; {remake}") from None


def file_hashes(directory: Path, names: Iterable[str]) -> dict[str, str]:
    """sha256 of the files a manifest lists besides its graphs (tokenizers, external weights)."""
    return {name: file_sha256(directory / name) for name in sorted(set(names))}


Hasher = Callable[[Path], str]  # a file's sha256: file_sha256, or core.stamps.Stamps.sha256


def verified_file(directory: Path, name: object, expected: object, what: str, remake: str = REMAKE,
                  sha256: Hasher = file_sha256) -> Path:
    """A file the manifest names: inside the directory, and with the sha256 the manifest records for it (a
    swapped or damaged file is refused on every read)."""
    path = contained_file(directory, name, ModelDirError, what, remake)
    if not is_sha256(expected):  # a file the manifest does not hash is read by nobody
        raise ModelDirError(f"{path}: {MANIFEST} records no sha256 for it (file added or manifest edited); {remake}")
    if sha256(path) != expected:
        raise ModelDirError(f"{path}: sha256 differs from {MANIFEST} (file changed or damaged); {remake}")
    return path


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def shared_dtype(manifest: ModelManifest, table: tuple[int, int]) -> str | None:
    """The type the tied table has in a directory: its precision's, except in int8 directories whose tables
    stayed float (too small to quantize, or --float-embeddings)."""
    if manifest.precision == "int8" and (math.prod(table) < EMBEDDING_MIN_ELEMENTS or
                                         (manifest.int8 or {}).get("embeddings") == FLOAT_EMBEDDINGS):
        return "float32"
    return SHARED_DTYPES.get(manifest.precision)


def _shared_entry(entry: object, table: dict[str, Any]) -> bool:
    return (isinstance(entry, dict) and is_text(entry.get("name")) and entry.get("dtype") == table["dtype"]
            and entry.get("shape") == table["shape"] and isinstance(entry.get("offset"), int)
            and not isinstance(entry["offset"], bool) and entry["offset"] >= 0)


_Read = TypeVar("_Read", bound="ReadDirectory")


@dataclass(frozen=True)
class ReadDirectory:
    """A model or engine directory read once: its manifest checked and parsed into its record, the model config and
    decoding rules among it, so that no reader looks fields up or rebuilds the config again. Its files are read
    through it, each checked against the manifest's sha256."""

    path: Path
    manifest: Any  # ModelManifest | EngineManifest: the subclass's record
    config: ModelConfig
    rules: TokenRules

    @staticmethod
    def _checked(directory: Path) -> tuple[Any, ModelConfig, TokenRules]:
        raise NotImplementedError

    @classmethod
    def read(cls: type[_Read], directory: str | Path) -> _Read:
        directory = Path(directory)
        return cls(directory, *cls._checked(directory))

    @property
    def precision(self) -> str:
        return self.manifest.precision

    @property
    def int8_mode(self) -> str | None:
        return self.manifest.int8_mode

    @property
    def tokenizer_files(self) -> tuple[str, ...]:
        return tuple(self.manifest.tokenizer_names())

    def verified(self, name: object, what: str) -> Path:
        """A file of the directory, inside it and as the manifest hashed it."""
        return verified_file(self.path, name, self.manifest.files.get(name), what)

    def tokenizer_file(self, side: str) -> Path:
        """The source or target tokenizer file, inside the directory and as hashed."""
        return self.verified(self.manifest.tokenizer[side], f"{side} tokenizer")

    def tokenizer_paths(self) -> list[Path]:
        """The tokenizer files as --vocab takes them: one when shared, else source then target (checked)."""
        source, target = (self.tokenizer_file(side) for side in ("source", "target"))
        return [source] if source == target else [source, target]

    def copy_tokenizers(self, target: Path) -> list[str]:
        """The tokenizer files (checked against their sha256) copied into `target`; returns their names."""
        names = self.manifest.tokenizer_names()
        for name in names:
            shutil.copyfile(self.verified(name, "tokenizer file"), target / name)
        return names

    def vocabulary(self) -> Vocabulary:
        """The tokenizers the directory carries, checked against the vocabulary sizes of its graphs."""
        manifest = self.manifest
        shared, seed = manifest.tokenizer["target"] == manifest.tokenizer["source"], manifest.token_rules is None
        source = load_tokenizer(self.tokenizer_file("source"), self.config.src_vocab_size, "source", seed)
        target = source if shared else load_tokenizer(self.tokenizer_file("target"), self.config.trg_vocab_size,
                                                      "target", seed)
        return Vocabulary(source, target)


@dataclass(frozen=True)
class ModelDir(ReadDirectory):
    """A model directory (ONNX graphs)."""

    manifest: ModelManifest
    _checked = staticmethod(_checked)

    @property
    def limits(self) -> dict[str, int]:
        return {key: self.manifest.limits[key] for key in ("max_source_length", "max_target_length")}

    @property
    def graphs(self) -> tuple[str, ...]:
        return tuple(self.manifest.graphs)

    def has(self, graph: str) -> bool:
        return _name(graph) in self.manifest.graphs

    def entry(self, graph: str) -> GraphEntry:
        """A graph's manifest entry: file, sha256, inputs and outputs (name, dtype, shape), external weights."""
        return self.manifest.graphs[_name(graph)]

    def tensor_types(self, graph: str) -> dict[str, str]:
        """A graph's inputs and outputs, name -> dtype, as its manifest entry records them."""
        return self.entry(graph).tensor_types()

    def graph_files(self, graph: str) -> list[tuple[str, object, str]]:
        """(name, the manifest's sha256, what it is) of the graph's file and of its external weights, if it has
        any."""
        graph = _name(graph)
        entry = self.manifest.graphs[graph]
        files = [(entry.file, entry.sha256, f"graph file of {graph}")]
        data = entry.data_file
        if data in self.manifest.files or entry.data is not None or (self.path / data).exists():
            files.append((data, self.manifest.files.get(data), f"external weights of {graph}"))
        return files

    def run_bytes(self) -> int:
        """What a translation maps: the encoder's files and its largest decoder's, each file once (the external
        layout's shared weights file counted once)."""
        def files(graph: str) -> set[str]:
            return {name for name, _, _ in self.graph_files(graph)}
        encoder = files(Graph.ENCODER.value)
        return max((sum(_size(self.path / name) for name in encoder | files(graph))
                    for graph in self.graphs if graph != Graph.ENCODER.value), default=0)

    def graph_path(self, graph: str, sha256: Hasher = file_sha256) -> Path:
        """The graph's file (and its external weights, if it has them), checked against the manifest's sha256."""
        paths = [verified_file(self.path, name, expected, what, sha256=sha256)
                 for name, expected, what in self.graph_files(graph)]
        return paths[0]

    def _unchecked_path(self, graph: str) -> Path:
        """The graph's file, for opening, which checks the directory whole itself."""
        return contained_file(self.path, self.entry(graph).file, ModelDirError, f"graph file of {_name(graph)}",
                              REMAKE)

    def _distinct_files(self) -> list[tuple[str, object, str]]:
        """Every graph's files, each once in manifest order: a weights file the graphs share is hashed once."""
        found: dict[str, tuple[str, object, str]] = {}
        for graph in self.graphs:
            for file in self.graph_files(graph):
                found.setdefault(file[0], file)
        return list(found.values())

    def verified_graphs(self) -> dict[str, Path]:
        """Every graph by name, its files checked as graph_path checks them, several at a time (sha256 releases the
        GIL: on two cores half the hashing of a base-config translate's start-up) and each once; the first damaged
        one in manifest order is the error. Runtimes check the graphs they do not run too: a damaged directory is
        refused whole."""
        with ThreadPoolExecutor(HASH_THREADS) as pool:
            futures = [pool.submit(verified_file, self.path, *file) for file in self._distinct_files()]
        for future in futures:
            future.result()
        return {graph: self.path / self.manifest.graphs[graph].file for graph in self.graphs}

    @contextlib.contextmanager
    def opening(self, sha256: Hasher = file_sha256) -> Iterator[dict[str, Path]]:
        """Every graph file by name, to open while the directory's graphs and their external weights are hashed in
        background threads (sha256 and ONNX Runtime's loading both release the GIL: on two cores a base-config
        start-up then hides most of the hashing). Leaving waits for the hashes: a damaged or swapped file is
        refused, with its own error, before anything opened from the directory is used. sha256: how a file is
        hashed (core.stamps: not again, where a writer stamped it)."""
        pool = ThreadPoolExecutor(HASH_THREADS)
        pending = [pool.submit(verified_file, self.path, name, expected, what, sha256=sha256)
                   for name, expected, what in self._distinct_files()]
        pool.shutdown(wait=False)
        try:
            yield {graph: self._unchecked_path(graph) for graph in self.graphs}
        finally:
            for future in pending:  # the first damaged one in manifest order is the error
                future.result()

    def shared_initializers(self, graph: str, check: bool = True) -> dict[str, np.ndarray]:
        """The initializers a graph shares with the encoder, mapped from its external weights (sha256 checked,
        unless the caller checks the whole directory itself: opening). Mapped, not read: the embedding lookups
        touch only the rows of the tokens they meet, and the pages are the page cache's, shared between processes.
        Copy-on-write: whatever writes to the table gets its own pages; the file never changes."""
        graph = _name(graph)
        entries = self.manifest.graphs[graph].shared
        if not entries:
            return {}
        # ONNX Runtime takes a supplied initializer of any shape and fails (or reads it wrongly) mid-decode, so the
        # entries must describe the one table sharing is for: the tied embedding, in the directory's weight type
        shape = self.config.tied_table
        table = {"dtype": shared_dtype(self.manifest, shape), "shape": list(shape)}
        if not isinstance(entries, list) or not all(_shared_entry(e, table) for e in entries):
            raise ModelDirError(f"{self.path / MANIFEST}: has an invalid graphs.{graph}.{SHARED} (each entry: name, "
                                f"dtype {table['dtype']}, shape {table['shape']}, offset); {REMAKE}")
        data, what = self.entry(graph).data_file, f"external weights of {graph}"
        path = self.verified(data, what) if check else contained_file(self.path, data, ModelDirError, what, REMAKE)
        arrays, size = {}, path.stat().st_size
        for entry in entries:
            dtype = np.dtype(entry["dtype"])
            if entry["offset"] + math.prod(entry["shape"]) * dtype.itemsize > size:
                raise ModelDirError(f"{path}: ends before {entry['name']!r} does (the manifest's {SHARED}); {REMAKE}")
            arrays[entry["name"]] = np.memmap(path, dtype, mode="c", offset=entry["offset"],
                                              shape=tuple(entry["shape"]))
        return arrays


def _name(graph: str) -> str:
    """A graph's manifest key, from its name or its Graph member (whose str() is the member's name)."""
    return getattr(graph, "value", graph)
