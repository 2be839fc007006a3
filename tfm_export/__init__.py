"""tfm-export: encoder-decoder Transformers from PyTorch to ONNX Runtime and TensorRT, with proof of parity.

The subpackages are the pipeline, in dependency order (a package imports only from those before it):
core -> artifacts -> model -> runtime -> graphs -> precision -> trt -> verify / bench / demo -> cli.
Each stage proves what it wrote by running it through ONNX Runtime, which is why the runtime comes before
the stages that make graphs.
"""

from .core.lazy import lazy_exports

__version__ = "0.1.0"

__all__, __getattr__ = lazy_exports(__name__, {
    "runtime.translator": ("Translator", "DecodeOptions", "Translation"),
})
