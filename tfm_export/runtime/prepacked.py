"""Writing a model directory's pre-packed graphs (runtime.prepacked_graphs reads them): made by loading the directory
as translation does, with the pre-packed graphs built instead of read. `tfm-export prepack`, and export, quantize
and generate for the directories they write."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from ..artifacts.manifest import ModelDirError
from ..artifacts.model_dir import ModelDir
from ..core.errors import TfmExportError, first_line
from .backends.decoder_step_search import load_sessions_with
from .backends.loaders import open_graph
from .prepacked_graphs import STAMPS, PrepackedGraphs, directory_stamps, staged_prepacked
from .session import DEFAULT_OPTIONS, SessionOptions
from .step_graph import chosen_step

log = logging.getLogger(__name__)


def prepack(directory: Path, options: SessionOptions = DEFAULT_OPTIONS) -> list[str]:
    """Write (or replace) the directory's pre-packed graphs (runtime.prepacked_graphs) for a CPU load with these
    options, made by loading it as translation does (the whole directory checked first); returns the graphs it holds.
    The old ones are replaced at once, and nothing is left behind on a failure."""
    model_dir = ModelDir.read(directory)
    options = dataclasses.replace(options, device="cpu", tensorrt_ep=False)
    if not model_dir.has(chosen_step(model_dir, options)):
        raise ModelDirError(f"{directory}: has no {chosen_step(model_dir, options).filename}, the only step the "
                            "pre-packed graphs are for (int8 static directories decode with decoder_step); "
                            "nothing to pre-pack")
    stamps = dataclasses.replace(directory_stamps(model_dir, options), recording=True)  # what is stamped: kept
    with staged_prepacked(model_dir.path) as staging:
        load_sessions_with(model_dir, options, open_graph, stamps, PrepackedGraphs(model_dir, stamps, build=staging))
        stamps.write(staging / STAMPS)
        return sorted(p.name for p in staging.iterdir() if p.is_dir())


def prepack_new(staging: Path, output: Path) -> None:
    """prepack for a directory being written (export, quantize, generate): one that cannot be made here (an ONNX
    Runtime that cannot save a graph, say) is a warning, not a failed export; the directory then loads without
    them."""
    try:
        prepack(staging)
    except TfmExportError as exc:
        log.warning("%s: pre-packed graphs not made (%s); it loads without them (`tfm-export prepack` retries)",
                    output, first_line(exc))
