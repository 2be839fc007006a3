"""Which step graph a model directory decodes with: decoder_step_search, or its fused twin where the directory
has one this ONNX Runtime computes right and the options ask for it. The backends, the pre-packed graphs and
quantization (which keeps the fused twin only where it is usable) ask here."""

from __future__ import annotations

from dataclasses import dataclass

from ..artifacts.model_dir import ModelDir
from ..core.graph_spec import TOTAL_LENGTH, Graph
from .session import SessionOptions, runs_fused_graphs

SEARCH, FUSED = Graph.DECODER_STEP_SEARCH, Graph.DECODER_STEP_SEARCH_FUSED
CAPACITY_STEP = 16  # positions added when a cache buffer is full: attention reads at most this many unused


@dataclass(frozen=True)
class StepOptions:
    """How ONNX Runtime's step backends run decoder_step_search: which of its two graphs, and how a full cache
    grows. The sessions' own settings are SessionOptions'."""

    # decoder_step_search_fused (the same step in ONNX Runtime's attention kernels) where the directory has it: None,
    # where it pays (an fp32 directory on the CPU, in place); True, wherever the directory has one (fp16 on CUDA,
    # say); False, never (decoder_step_search, standard ONNX operators only)
    fused: bool | None = None
    cache_step: int = CAPACITY_STEP  # positions a full cache buffer grows by


DEFAULT_STEP = StepOptions()


def fused_usable(model_dir: ModelDir) -> bool:
    """The directory has decoder_step_search_fused as this runtime runs it (its total length fed from the host;
    an older export's computes it on the device), and this ONNX Runtime computes it right."""
    if not model_dir.has(FUSED) or not runs_fused_graphs():
        return False
    return TOTAL_LENGTH in {t["name"] for t in model_dir.entry(FUSED).inputs}


def chosen_step(model_dir: ModelDir, options: SessionOptions, step: StepOptions = DEFAULT_STEP,
                in_place: bool = True) -> Graph:
    """decoder_step_search_fused where it is usable and `step` asks for it (by default where it pays: an fp32
    directory decoded on the CPU in place, not by the device backend); else decoder_step_search."""
    pays = model_dir.precision == "fp32" and not options.on_gpu and in_place
    wanted = pays if step.fused is None else step.fused
    return FUSED if wanted and fused_usable(model_dir) else SEARCH
