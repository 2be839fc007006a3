"""The PyTorch reference: the seed's Transformer and its variants (norms, positions, attention, ffn, layers,
transformer), checkpoints (both formats, validated, never unpickling
code), the full-recompute reference decoders that every fast decoder is tested against, a trainer, and
random-weight models of any size.

May import: core, artifacts. Imports PyTorch.
"""

from ..core.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "transformer": ("Transformer",),
    "checkpoint": ("load_checkpoint", "save_checkpoint", "Checkpoint"),
    "synthetic": ("random_checkpoint",),
    "train": ("train",),
})
