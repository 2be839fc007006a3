"""Which step graph a model directory decodes with: decoder_step_search, or its fused twin where the directory
has one this ONNX Runtime computes right and the options ask for it. The backends, the pre-packed graphs and
quantization (which keeps the fused twin only where it is usable) ask here."""

from __future__ import annotations

from ..artifacts.model_dir import ModelDir
from ..core.graph_spec import TOTAL_LENGTH, Graph
from .session import SessionOptions, runs_fused_graphs

SEARCH, FUSED = Graph.DECODER_STEP_SEARCH, Graph.DECODER_STEP_SEARCH_FUSED


def fused_usable(model_dir: ModelDir) -> bool:
    """The directory has decoder_step_search_fused as this runtime runs it (its total length fed from the host;
    an older export's computes it on the device), and this ONNX Runtime computes it right."""
    if not model_dir.has(FUSED) or not runs_fused_graphs():
        return False
    return TOTAL_LENGTH in {t["name"] for t in model_dir.entry(FUSED).inputs}


def chosen_step(model_dir: ModelDir, options: SessionOptions, in_place: bool = True) -> Graph:
    """decoder_step_search_fused where it is usable and the options ask for it (by default where it pays: an fp32
    directory decoded on the CPU in place, not by the device backend); else decoder_step_search."""
    pays = model_dir.precision == "fp32" and not options.on_gpu and in_place
    wanted = pays if options.fused is None else options.fused
    return FUSED if wanted and fused_usable(model_dir) else SEARCH
