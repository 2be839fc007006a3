"""Artifact directories on disk: the model directory (ONNX graphs) and the TensorRT engine directory, their
manifests read back with every field checked, and staged writes that leave a directory complete or absent.

May import: core. No PyTorch, ONNX or ONNX Runtime.
"""

from ..core.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "model_dir": ("read_manifest", "load_vocabulary", "graph_path"),
    "engine_dir": ("read_engine_manifest", "is_engine_dir"),
    "staging": ("staged_directory",),
    "manifest": ("write_manifest", "ModelDirError"),
})
