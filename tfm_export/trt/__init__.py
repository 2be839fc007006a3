"""TensorRT: the static compatibility report per parser release, real builds of the graphs (TensorRT, or
TensorRT-RTX without a GPU), Polygraphy runs of the graphs, optimisation profiles, and engine builds into an
engine directory (the runtime's TensorRT backend runs them). TensorRT itself is imported only when a build or
check needs it.

May import: core, artifacts, runtime, graphs (ONNX-only modules), precision.
"""

from ..core.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "compat": ("check_model_dir",),
    "polygraphy_check": ("check_onnxruntime",),
    "build": ("build_engines",),
    "build_check": ("check_builds",),
    "profiles": ("ShapeLimits",),
})
