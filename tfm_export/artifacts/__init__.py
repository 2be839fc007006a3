"""Artifact directories on disk: the model directory (ONNX graphs) and the TensorRT engine directory, their
manifests read back with every field checked into their records, and staged writes that leave a directory
complete or absent.

May import: core. No PyTorch, ONNX or ONNX Runtime.
"""

from ..core.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "model_dir": ("ModelDir", "read_manifest"),
    "engine_dir": ("EngineDir", "read_engine_manifest", "is_engine_dir"),
    "records": ("ModelManifest", "EngineManifest", "GraphEntry"),
    "staging": ("staged_directory",),
    "manifest": ("write_manifest", "ModelDirError"),
})
