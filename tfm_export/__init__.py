"""tfm-export: encoder-decoder Transformers from PyTorch to ONNX Runtime and TensorRT, with proof of parity.

Data flows one way through the modules: checkpoint -> model -> graphs -> precision -> engines -> runtime.
"""

__version__ = "0.1.0"

_API = {"Translator", "DecodeOptions", "Translation"}


def __getattr__(name: str):
    """`from tfm_export import Translator` without importing ONNX Runtime for every submodule user."""
    if name in _API:
        from . import translator
        return getattr(translator, name)
    raise AttributeError(f"module 'tfm_export' has no attribute {name!r}")
