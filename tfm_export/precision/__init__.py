"""fp32 model directory -> fp16 or int8 model directory of the same contract: the converters, calibration
traces from real decoding, and the pipeline that writes the new directory. No PyTorch.

May import: core, artifacts, runtime, graphs (its ONNX-only modules).
"""

from ..core.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "pipeline": ("quantize_model_dir", "Calibration"),
    "fp16": ("to_fp16",),
    "int8": ("quantize_static_graph", "quantize_dynamic_graph"),
    "calibration": ("record_traces",),
})
