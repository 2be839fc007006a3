"""Where an exported graph's weights go when it is saved, one graph at a time: the two layouts of a model directory.

- inline (models below EXTERNAL_DATA_BYTES): each graph file holds its own weights, except that the step variants
  keep the tied embedding table, the very tensor the encoder holds, in `<graph>.onnx.data`, whence the runtime
  reads it once for both sessions (artifacts.model_dir.SHARED).
- external (larger models, or asked for): every graph's weights in one file, WEIGHTS_FILE, each tensor written
  once however many graphs read it (the decoder's weights serve decoder_step and its variants alike), so the
  directory is about the size of the model's weights. Each graph's manifest entry names the file (DATA_KEY).
Either way a graph is checked on disk right after it is saved (onnx_io.check_saved) and its weights are never
held in memory beyond the block being written.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import onnx
import torch

from ..artifacts.model_dir import SHARED_DTYPES, SHARED_MIN_BYTES, WEIGHTS_FILE
from ..artifacts.records import ModelManifest
from ..core.errors import TfmExportError
from ..core.files import file_sha256
from ..core.graph_spec import Graph, GraphSpec
from ..core.memory import total_memory_bytes
from .export import ExportedGraph
from .onnx_io import check_saved, sharing_note
from .weights import INLINE_MAX_BYTES, Key, Weight, WeightFile, bind

EXTERNAL_DATA_BYTES = 2 * 1024 ** 3 - 64 * 1024 ** 2  # protobuf's 2 GB limit on a graph file, with headroom


# what an export holds besides its weights (measured at NLLB-200's shapes, docs/benchmarks.md): the tied table's
# transpose, which ONNX Runtime folds for the parity check, the logits compared, and the libraries themselves
EXPORT_EXTRA_BYTES = 3 << 29  # 1.5 GiB


def check_room(model: torch.nn.Module, output: Path, external: bool) -> None:
    """Before any work: the export fits this machine's memory and the output's disk, or one line says what it needs
    against what there is. Memory: the weights (mapped), their largest table once more and EXPORT_EXTRA_BYTES,
    against the machine's physical memory; disk: the weights once."""
    weights = weight_bytes(model)
    if not external and weights >= EXTERNAL_DATA_BYTES:
        raise TfmExportError(f"--weights inline keeps each graph's weights in its file, which protobuf caps at 2 GB; "
                             f"this model has {weights / 1e9:.1f} GB of weights: use --weights external (or auto)")
    table = max((t.numel() * t.element_size() for t in model.parameters() if t.dim() == 2), default=0)
    needed, total = weights + table + EXPORT_EXTRA_BYTES, total_memory_bytes()
    if total is not None and needed > total:
        raise TfmExportError(f"exporting this model needs about {needed / 1e9:.1f} GB of memory "
                             f"({weights / 1e9:.1f} GB of weights, its largest table again and "
                             f"{EXPORT_EXTRA_BYTES / 1e9:.1f} GB more), and this machine has {total / 1e9:.1f} GB; "
                             "export it on a larger machine")
    existing = next(p for p in (output.resolve(), *output.resolve().parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if weights > free:
        raise TfmExportError(f"{output}: its disk has {free / 1e9:.1f} GB free, and the export writes about "
                             f"{weights / 1e9:.1f} GB; free some space or choose another --output")


def weight_bytes(model: torch.nn.Module) -> int:
    """The model's weights as stored: each tensor once (a tied table is one parameter)."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


class GraphSaver:
    """Saves a directory's graphs as they are exported (the encoder first), and what the manifest says of them."""

    def __init__(self, directory: Path, table: tuple[int, int], external: bool) -> None:
        self.directory, self.table, self.external = directory, table, external
        self.file = WeightFile(directory / WEIGHTS_FILE) if external else None
        self.hashes: dict[Graph, str] = {}
        self.shared: dict[Graph, list[dict[str, Any]]] = {}
        self.data: dict[str, str] = {}  # external weight files and their sha256, for the manifest
        self.encoder_keys: set[Key] = set()

    def save(self, exported: ExportedGraph, spec: GraphSpec) -> None:
        path = self.directory / exported.graph.filename
        if exported.graph is Graph.ENCODER:
            self.encoder_keys = {w.key for w in exported.weights.values()}
        if self.external:
            bind(exported.proto, exported.weights, lambda name, weight: weight.nbytes > INLINE_MAX_BYTES, self.file)
            if exported.graph is not Graph.ENCODER:
                self._record_shared(exported, self.file)
        elif spec.shares_table:
            self._save_sharing(exported, path)
        else:
            bind(exported.proto, exported.weights)
        onnx.save_model(exported.proto, path)
        check_saved(path, spec)
        self.hashes[exported.graph] = file_sha256(path)

    def _save_sharing(self, exported: ExportedGraph, path: Path) -> None:
        """The tied table the encoder holds too, in the variant's own data file; the rest inline."""
        with WeightFile(path.with_name(path.name + ".data")) as file:
            bind(exported.proto, exported.weights, self._shares, file)
            file.close()
        if self._record_shared(exported, file):
            self.data[file.path.name] = file.sha256
        else:
            file.path.unlink()

    def _record_shared(self, exported: ExportedGraph, file: WeightFile) -> bool:
        """The manifest's SHARED entries of the graph: the tied table it holds as the encoder does, where `file`
        holds it, for the runtime to map once for both sessions. Whether there is one."""
        entries = [{"name": name, "dtype": weight.dtype.name, "shape": list(weight.shape),
                    "offset": file.placed[weight.key][0]}
                   for name, weight in exported.weights.items()
                   if weight.key in file.placed and self._shares(name, weight)]
        if entries:
            self.shared[exported.graph] = entries
        return bool(entries)

    def _shares(self, name: str, weight: Weight) -> bool:
        return (weight.key in self.encoder_keys and weight.shape == self.table and weight.nbytes >= SHARED_MIN_BYTES
                and weight.dtype.name in SHARED_DTYPES.values())

    def close(self) -> dict[str, str]:
        """The external weight files written, by name, and their sha256 (hashed as they were written)."""
        if self.file is not None:
            self.file.close()
            self.data[self.file.path.name] = self.file.sha256
        return dict(self.data)

    def __enter__(self) -> GraphSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.__exit__(*exc)

    def describe(self, manifest: ModelManifest) -> None:
        """The graphs' manifest entries: the shared file they read (external), or the tied table they share."""
        for graph in self.hashes:
            entry = manifest.graphs[graph.value]
            if self.external:
                entry.data = WEIGHTS_FILE
            if self.shared.get(graph):
                entry.shared = self.shared[graph]
                manifest.note(sharing_note(graph.value))
        if self.external:
            manifest.note(f"every graph's weights in {WEIGHTS_FILE}, each tensor once")
