"""The demo task (English number words -> French number words): its data, the training run that makes
models/demo/ckpt.pt, and the held-out exact-match evaluation.

May import: core, artifacts, model, runtime.
"""

from ..core.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "train": ("train_demo",),
    "evaluate": ("evaluate_demo",),
})
