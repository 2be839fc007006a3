"""`tfm-run bench`: every backend side by side on the same weights and inputs, each in its own process,
with CTranslate2 as the external anchor; reports as tables, JSON, markdown and plots.

May import: core, artifacts, model, runtime, graphs, precision, trt.
"""

from ..core.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "run": ("BenchRequest", "run_benchmark"),
    "protocol": ("BenchSettings",),
})
