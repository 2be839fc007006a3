"""`tfm-export verify`: fp32 directories against PyTorch (tensors step by step, greedy and beam agreement with
the reference decoders), fp16/int8 directories against their fp32 parent (per-graph errors, agreement, BLEU).

May import: core, artifacts, model, runtime, graphs, precision, trt.
"""

from ..core.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "directory": ("VerifyRequest", "verify_model_dir"),
    "precision": ("compare_precision",),
})
