"""A model directory in the layout Hugging Face's runtimes load: transformers.js (Node and the browser) and Optimum's
ORTModelForSeq2SeqLM, each graph held to PyTorch (or to the directory's own graphs) before the layout is written."""

from __future__ import annotations

from pathlib import Path

from ..artifacts.model_dir import ModelDir
from ..core.errors import TfmExportError
from ..graphs.onnx_io import EXTERNAL_DATA_BYTES
from ..graphs.parity import Reference
from ..verify.fp32 import checkpoint_for
from .parity import check_view, from_directory, from_pytorch, sample
from .view import HfView, write_view


def export_hf(directory: Path, output: Path, checkpoint: Path | None = None, force: bool = False,
              external_above: int = EXTERNAL_DATA_BYTES, progress: bool = False) -> HfView:
    """The layout of `directory` in `output`; with `checkpoint` (an fp32 directory's), held to PyTorch.
    external_above, progress: write_view's."""
    model_dir = ModelDir.read(directory)
    if checkpoint is not None and model_dir.precision != "fp32":
        raise TfmExportError(f"--checkpoint: for fp32 directories; {directory} is {model_dir.precision}, and its "
                             "layout is held to its own graphs (which `tfm-export verify` holds to the fp32 ones)")
    # held until its reference is computed, then let go before the layout's sessions open
    loaded = {"ckpt": checkpoint_for(directory, checkpoint, ())} if checkpoint is not None else {}

    def parity(staging: Path) -> list[str]:
        src, trg = sample(model_dir.config)
        against = "PyTorch" if loaded else f"{directory}'s own graphs"
        want = (from_pytorch(Reference.of(loaded.pop("ckpt").model, src, trg)) if loaded
                else from_directory(model_dir, src, trg))
        return [f"against {against}:", *check_view(staging, model_dir.config, model_dir.precision, want, src, trg)]

    return write_view(model_dir, output, force, parity, external_above, progress)
