"""fp32 model directory -> fp16 or int8 model directory of the same contract, written atomically.

The new directory has the same input/output names and axes (only float dtypes may change for fp16
without --keep-io-types), its own manifest recording the precision, how it was made and from what,
and the same tokenizer files, so everything that runs the fp32 directory runs this one.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from tqdm import tqdm

from ..artifacts.manifest import write_manifest
from ..artifacts.model_dir import (
    FLOAT_EMBEDDINGS,
    INT8_MODES,
    WEIGHTS_FILE,
    ModelDir,
    file_hashes,
)
from ..artifacts.model_dir import PRECISIONS as MODEL_PRECISIONS
from ..artifacts.records import GraphEntry, ModelManifest
from ..artifacts.staging import staged_directory
from ..core.errors import TfmExportError
from ..core.files import file_sha256
from ..core.graph_spec import CONTRACT_GRAPHS, OPTIONAL_GRAPHS, Graph, GraphSpec, all_specs
from ..core.memory import return_freed_heap, total_memory_bytes
from ..core.sources import decode_text
from ..core.tokenizer import Vocabulary
from ..graphs.inputs import random_sources
from ..graphs.onnx_io import (
    add_shared,
    check_contract,
    check_saved,
    graph_weight_bytes,
    load_graph,
    save_graph_of,
    sharing_note,
    tensors_of,
)
from ..graphs.weights import WeightFile, externalize
from ..runtime import decoding
from ..runtime.backends import graph_decoders
from ..runtime.prepacked import prepack_new
from ..runtime.prepacked_graphs import stamp_new
from ..runtime.step_graph import fused_usable
from .calibration import Traces, record_traces
from .fp16 import to_fp16
from .int8 import float_ops, quantize_dynamic_graph, quantize_static_graph

PRECISIONS = tuple(p for p in MODEL_PRECISIONS if p != "fp32")  # what quantize makes from fp32
# what quantizing holds besides a graph and its table's copies: the libraries, a weight's float temporaries (1 GiB)
QUANTIZE_EXTRA_BYTES = 1 << 30
NO_STATIC_SEARCH = ("int8 static graphs are calibrated on traces of the contract's decoder_step and are meant for "
                    "TensorRT; decoder_step_search is made for fp32, fp16 and int8 dynamic")
NO_FUSED = ("fp32 and fp16 only: its ONNX Runtime operators are not quantized; this directory decodes through "
            "decoder_step_search")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Calibration:
    """Calibration texts and where they came from (the file's sha256 goes into the manifest)."""

    path: Path
    texts: Sequence[str]
    max_length: int | None = None  # generated tokens per sentence while tracing; None = the model's positions
    sha256: str | None = None  # of the bytes read (None: hash the file when the manifest is written)

    @classmethod
    def from_options(cls, path: Path | None, max_length: int | None = None) -> Calibration | None:
        """The --calibration file read (one sentence per line), or None when none was given."""
        if path is None:
            if max_length is not None:
                raise TfmExportError("--calibration-max-length is only for --precision int8 --mode static, with "
                                     "--calibration")
            return None
        try:  # read once: a pipe cannot be read again for the manifest's sha256
            data = path.read_bytes()
        except OSError as exc:
            raise TfmExportError(f"{path}: cannot read input ({exc.strerror})") from None
        return cls(path, decode_text(data, str(path)), max_length, hashlib.sha256(data).hexdigest())


def check_request(directory: ModelDir, precision: str, mode: str | None,
                  calibration: Calibration | None, keep_io_types: bool = False, float_embeddings: bool = False) -> str:
    """Every way the request can be wrong, before any slow work; returns the int8 mode (static by default)."""
    if precision not in PRECISIONS:
        raise TfmExportError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if mode is not None and precision != "int8":
        raise TfmExportError("--mode is only for --precision int8 (fp16 has one mode); drop it")
    mode = mode or "static"
    if float_embeddings and precision != "int8":
        raise TfmExportError("--float-embeddings is only for --precision int8 (fp16 graphs store every table fp16)")
    if keep_io_types and precision != "fp16":
        raise TfmExportError("--keep-io-types is only for --precision fp16 (int8 graphs keep fp32 inputs/outputs)")
    positions = directory.limits["max_target_length"]
    if calibration is not None and calibration.max_length is not None and calibration.max_length > positions:
        raise TfmExportError(f"--calibration-max-length {calibration.max_length} is beyond the model's {positions} "
                             "target positions; give at most that")
    if directory.precision != "fp32":
        parent = directory.manifest.parent_path or "its fp32 parent"
        raise TfmExportError(f"{directory.path}: is already {directory.precision}; quantize the fp32 model directory "
                             f"({parent}) instead")
    if precision == "int8" and mode not in INT8_MODES:
        raise TfmExportError(f"unknown int8 mode {mode!r}; choose static or dynamic")
    static = precision == "int8" and mode == "static"
    if static and calibration is None:
        raise TfmExportError("--precision int8 --mode static (the default) needs --calibration FILE: sentences in "
                             "the model's source language, one per line (calibration/README.md); or pass --mode "
                             "dynamic for int8 without calibration (ONNX Runtime on CPUs)")
    if calibration is not None and not static:
        raise TfmExportError("--calibration is only used by --precision int8 --mode static; drop it")
    return mode


def quantize_model_dir(source: Path, output: Path, precision: str, mode: str | None = None,
                       calibration: Calibration | None = None, keep_io_types: bool = False, force: bool = False,
                       progress: bool = True, float_embeddings: bool = False,
                       prepacked: bool | None = None) -> ModelManifest:
    """Write the fp16/int8 sibling of an fp32 model directory; returns its manifest. float_embeddings: int8
    keeps the embedding tables (and a projection tied to them) float: the strict reading of "embeddings in higher
    precision", at 2x the size. prepacked: the pre-packed graphs made (None: for the inline layout only, as
    export makes them)."""
    parent = ModelDir.read(source)
    manifest = parent.manifest  # what the new manifest copies
    mode = check_request(parent, precision, mode, calibration, keep_io_types, float_embeddings)
    check_memory(parent)
    vocab = parent.vocabulary()  # present and parseable, before any slow work
    variants = _variants(parent, precision, mode)
    graphs = [*CONTRACT_GRAPHS, *variants]
    parent.verified_graphs()  # the converted ones and the others: a damaged directory is refused
    external = manifest.external
    keep = (source, *([calibration.path] if calibration else []))
    with staged_directory(output, force, keep=keep) as staging, contextlib.ExitStack() as stack, \
            tqdm(total=len(graphs) + 2, desc=f"{precision}", disable=not progress) as bar:
        traces = None
        if calibration is not None:
            bar.set_postfix_str("calibration traces")
            traces = _traces(source, vocab, calibration, progress)
        bar.update()
        config = parent.config
        specs = all_specs(config)
        entries, kept, listed, shared = {}, {}, [], {}
        encoder = None  # converted first; the graphs after it share its tied table (inline layout)
        weights = stack.enter_context(WeightFile(staging / WEIGHTS_FILE)) if external else None
        for graph in graphs:  # one at a time: loaded, converted, saved and let go
            bar.set_postfix_str(graph.value)
            converted, kept[graph.value] = _convert(load_graph(parent, graph.value, check=False),
                                                    precision, mode, keep_io_types, traces, specs[graph],
                                                    not float_embeddings)
            _set_precision_metadata(converted, precision)
            if weights is not None:
                externalize(converted, weights)
                onnx.save_model(converted, staging / graph.filename)
                checked = check_saved(staging / graph.filename, specs[graph])
            else:
                encoder = converted if graph is Graph.ENCODER else encoder
                checked = check_contract(converted, specs[graph])
                files, shared[graph] = save_graph_of(specs[graph], converted, staging, encoder, config.tied_table)
                listed += [p.name for p in files[1:]]
            entries[graph.value] = dataclasses.replace(
                manifest.graphs[graph.value], sha256=file_sha256(staging / graph.filename), shared=[],
                inputs=tensors_of(checked.graph.input), outputs=tensors_of(checked.graph.output))
            del converted, checked
            return_freed_heap()
            bar.update()
        written = {}  # hashed as they were written
        if weights is not None:
            weights.close()
            written[WEIGHTS_FILE] = weights.sha256
        listed += parent.copy_tokenizers(staging)
        new = _manifest(manifest, source, precision, mode, keep_io_types, entries, kept, calibration, traces)
        new.files = dict(sorted((file_hashes(staging, listed) | written).items()))
        if precision == "int8" and float_embeddings:
            new.int8["embeddings"] = FLOAT_EMBEDDINGS
        not_applied = {Graph.DECODER_STEP_SEARCH: NO_STATIC_SEARCH, Graph.DECODER_STEP_SEARCH_FUSED: NO_FUSED}
        for graph in [g for g in not_applied if parent.has(g) and g not in variants]:
            new.optimizations_not_applied[graph.value] = not_applied[graph]
        add_shared(new, shared)
        write_manifest(staging, new)
        bar.set_postfix_str("smoke test")
        _smoke_test(staging, output, source)
        if (prepacked or (prepacked is None and not external)) and precision == "int8" \
                and Graph.DECODER_STEP_SEARCH in variants:
            bar.set_postfix_str("prepack")
            prepack_new(staging, output)
        elif external:  # no pre-packed graphs: stamps alone, for the first load of gigabytes
            stamp_new(staging, {**new.files, **{e.file: e.sha256 for e in entries.values()}})
        bar.update()
    return new


def check_memory(directory: ModelDir) -> None:
    """Before any work: the graphs are converted one at a time, and the largest one's weights, its tied table twice
    more (transposed, then quantized) and QUANTIZE_EXTRA_BYTES must fit this machine's memory; else one line says
    what it needs against what there is."""
    largest = max(graph_weight_bytes(directory, graph) for graph in directory.graphs)
    table = math.prod(directory.config.tied_table) * 4
    needed, total = largest + 2 * table + QUANTIZE_EXTRA_BYTES, total_memory_bytes()
    if total is not None and needed > total:
        raise TfmExportError(f"{directory.path}: quantizing it needs about {needed / 1e9:.1f} GB of memory (its "
                             f"largest graph's {largest / 1e9:.1f} GB of weights, its tied table twice more and "
                             f"{QUANTIZE_EXTRA_BYTES / 1e9:.1f} GB), and this machine has {total / 1e9:.1f} GB; "
                             "quantize it on a larger machine")


def _variants(parent: ModelDir, precision: str, mode: str | None) -> list[Graph]:
    """The optional step graphs made in this precision: none for int8 static (TensorRT's); decoder_step_search
    otherwise, and its fused twin in fp16 (ONNX Runtime's attention kernels take fp16, on CUDA and on the CPU)."""
    if (precision, mode) == ("int8", "static"):
        return []
    return [g for g in OPTIONAL_GRAPHS if parent.has(g) and (g.standard_ops or (precision == "fp16" and
                                                                                fused_usable(parent)))]


def _traces(source: Path, vocab: Vocabulary, calibration: Calibration, progress: bool) -> Traces:
    return record_traces(source, calibration.texts, vocab.source, str(calibration.path),
                         max_length=calibration.max_length, target=vocab.target, progress=progress)


def _convert(proto: onnx.ModelProto, precision: str, mode: str, keep_io_types: bool, traces: Traces | None,
             spec: GraphSpec, int8_embeddings: bool) -> tuple[onnx.ModelProto, dict[str, int]]:
    if precision == "fp16":
        return to_fp16(proto, keep_io_types)
    if mode == "static":
        quantized = quantize_static_graph(proto, traces.feeds[spec.graph], int8_embeddings)
    else:
        quantized = quantize_dynamic_graph(proto, int8_embeddings, keep_embedding=spec.shares_table)
    return quantized, float_ops(quantized)


def _set_precision_metadata(proto: onnx.ModelProto, precision: str) -> None:
    props = {p.key: p.value for p in proto.metadata_props}
    props["tfm_export.precision"] = precision
    onnx.helper.set_model_props(proto, props)


def _manifest(parent: ModelManifest, source: Path, precision: str, mode: str, keep_io_types: bool,
              entries: dict[str, GraphEntry], kept: dict[str, dict[str, int]], calibration: Calibration | None,
              traces: Traces | None) -> ModelManifest:
    # generate.onnx wraps the parent's graphs; `tfm-export generate` makes one for these
    new = dataclasses.replace(copy.deepcopy(parent), generate=None, precision=precision, graphs=entries,
                              parent={"path": str(source.resolve()), "precision": parent.precision,
                                      "graphs_sha256": {g: e.sha256 for g, e in parent.graphs.items()}})
    if precision == "fp16":
        new.fp16 = {"keep_io_types": keep_io_types, "kept_fp32": kept,
                    "converter": "onnxruntime.transformers.float16 (weights clamped to fp16's finite range)"}
    else:
        new.int8 = {"mode": mode, "kept_float": kept, "weights": "int8 symmetric per output channel",
                    "activations": "int8 symmetric per tensor, zero point 0, calibrated ranges (MinMax)"
                    if mode == "static" else "quantized per call at run time (ONNX Runtime CPU)",
                    "embeddings": "int8 per row, gathered from DequantizeLinear(table)" if mode == "static"
                    else "int8 per row, dequantized after the Gather"}
    if calibration is not None and traces is not None:
        new.int8["calibration"] = {
            "file": str(calibration.path.resolve()), "sha256": calibration.sha256 or file_sha256(calibration.path),
            "sentences": traces.sentences,
            "unknown_token_rate": round(traces.unknown_rate, 4), "max_length": calibration.max_length,
            "calls": {g.value: traces.calls[g] for g in CONTRACT_GRAPHS},
            "calls_sampled": {g.value: len(traces.feeds[g]) for g in CONTRACT_GRAPHS}}
    notes = {sharing_note(g) for g in parent.graphs}  # add_shared says it again for the graphs that share here
    new.optimizations = [*(o for o in parent.optimizations if o not in notes),
                         f"{precision}" + (f" {mode}" if precision == "int8" else "")]
    return new


def _smoke_test(staging: Path, output: Path, source: Path) -> None:
    """The new graphs load in ONNX Runtime and decode a few tokens; an unusable artifact is never left."""
    decoders = graph_decoders(staging)  # every step graph made here, an fp16 fused one included
    backend = decoders["decoder_step"]
    cfg, precision = backend.config, backend.model_dir.precision
    src = random_sources(cfg.src_vocab_size, 2, min(8, cfg.n_position), seed=0)
    backends = list(decoders.values())
    hyps = [h for b in backends for h in decoding.greedy(b, src, min(4, cfg.n_position))]
    if any(not np.isfinite(h.score) for h in hyps):
        hint = "try --keep-io-types or int8" if precision == "fp16" else "try the other --mode or fp16"
        raise TfmExportError(f"{output}: not written: the {precision} graphs made from {source} give non-finite "
                             f"scores (values beyond the precision's range); {hint}")
