"""tfm-export: encoder-decoder Transformers from PyTorch to ONNX Runtime and TensorRT, with proof of parity.

Data flows one way through the modules: checkpoint -> model -> graphs -> precision -> engines -> runtime.
"""

__version__ = "0.1.0"
