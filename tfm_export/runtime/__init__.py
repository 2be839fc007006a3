"""Translation without the export code: the one greedy/beam decoding loop over a backend interface (encode,
step, and the three reorders expand/select/permute), backends for ONNX Runtime (decoder_step_search over IO
binding, or the contract's decoder_step), PyTorch and TensorRT opened by one registry (backends.open_backend), and
the Translator (text in, text out). Importing it loads neither PyTorch nor ONNX; the PyTorch, IO-binding and
TensorRT backends import torch when they are opened.

May import: core, artifacts, model (the PyTorch backend only).
"""

from ..core.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "translator": ("Translator", "DecodeOptions", "Translation"),
    "backends": ("open_backend", "BACKENDS"),
    "ort_backend": ("OrtBackend",),
    "generate_backend": ("GenerateBackend",),
    "session": ("SessionOptions",),
    "decoding": ("greedy", "beam_search"),
})
