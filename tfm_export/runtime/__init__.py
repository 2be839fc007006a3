"""Translation without the export code: the one greedy/beam decoding loop over a three-method backend
interface, backends for ONNX Runtime (NumPy or IO binding), PyTorch and TensorRT, and the Translator (text in,
text out). Importing it loads neither PyTorch nor ONNX; the PyTorch, IO-binding and TensorRT backends import
torch when they are opened.

May import: core, artifacts, model (the PyTorch backend only).
"""

from ..core.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "translator": ("Translator", "DecodeOptions", "Translation", "RUNTIME_BACKENDS"),
    "ort_backend": ("OrtBackend",),
    "generate_backend": ("GenerateBackend",),
    "session": ("SessionOptions",),
    "decoding": ("greedy", "beam_search"),
})
