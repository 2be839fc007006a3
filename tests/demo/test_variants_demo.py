"""The trained "modern" demo (pre-norm + RMSNorm + SwiGLU + RoPE, models/demo-modern): held-out exact match
through PyTorch and through its ONNX Runtime fp32, int8 static and int8 dynamic graphs, and decodes through
the graphs token-identical to the reference decoders."""

from __future__ import annotations

import pytest
import torch
from support.backends import concat_backend
from support.common import CALIBRATION, REPO

from tfm_export.core.batching import pad_batch
from tfm_export.core.tokenizer import BOS_ID, EOS_ID
from tfm_export.core.variants import PRESETS
from tfm_export.demo import numbers as demo_numbers
from tfm_export.demo.evaluate import evaluate_demo
from tfm_export.graphs.pipeline import export_model_dir
from tfm_export.model import reference_decoding
from tfm_export.model.loading import load_checkpoint
from tfm_export.precision.pipeline import Calibration, quantize_model_dir
from tfm_export.runtime import decoding
from tfm_export.runtime.translator import Translator

MODERN_CKPT = REPO / "models" / "demo-modern" / "ckpt.pt"


@pytest.fixture(scope="module")
def modern(tmp_path_factory):
    """The checkpoint and its fp32, int8 static and int8 dynamic directories."""
    ckpt = load_checkpoint(MODERN_CKPT)
    root = tmp_path_factory.mktemp("demo-modern")
    export_model_dir(ckpt, root / "fp32", progress=False)
    texts = CALIBRATION.read_text().splitlines()
    quantize_model_dir(root / "fp32", root / "int8-static", "int8", calibration=Calibration(CALIBRATION, texts),
                       progress=False)
    quantize_model_dir(root / "fp32", root / "int8-dynamic", "int8", mode="dynamic", progress=False)
    return ckpt, {name: root / name for name in ("fp32", "int8-static", "int8-dynamic")}


def test_the_shipped_modern_demo_is_the_modern_preset():
    cfg = load_checkpoint(MODERN_CKPT).config
    assert {k: getattr(cfg, k) for k in PRESETS["modern"]} == PRESETS["modern"]


@pytest.mark.slow
def test_modern_demo_reaches_97_percent_exact_match_in_fp32_and_int8(modern):
    ckpt, dirs = modern
    scores = {name: evaluate_demo(Translator.load(path)).exact_match for name, path in dirs.items()}
    assert all(score >= 0.97 for score in scores.values()), scores


@pytest.mark.slow
def test_modern_demo_decodes_through_the_graphs_like_the_reference(modern):
    ckpt, dirs = modern
    texts = [en for en, _ in demo_numbers.held_out_pairs()[:100]]
    src = pad_batch([[BOS_ID, *ckpt.vocab.source.encode(t), EOS_ID] for t in texts])
    backend = concat_backend(dirs["fp32"])
    assert [h.tokens for h in decoding.greedy(backend, src, 40)] == \
        [h.tokens for h in reference_decoding.greedy_decode(ckpt.model, torch.from_numpy(src), 40)]
    assert [h[0].tokens for h in decoding.beam_search(backend, src, 4, 40)] == \
        [h[0].tokens for h in reference_decoding.beam_search(ckpt.model, torch.from_numpy(src), 4, 40)]
