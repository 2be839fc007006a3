"""Serving on NVIDIA Triton Inference Server: `tfm-export triton` writes a model repository (a Python-backend
translator, or native encoder/decoder_step models driven by a Python BLS model), and the Python-backend model
that runs inside the server as a thin layer over the runtime's Translator and decoding loop. Also a local
tritonserver (the one bundled with nvidia-pytriton) and a concurrent load run, for tests and benchmarks.

The modules loaded inside the server (`triton_model`, `requests`, `bls`, `contract`) import only the runtime,
so the runtime-only install (no PyTorch, no ONNX) is enough there; `model_config`, `repository`,
`local_server` and `load` need the `serving` extra (tritonclient).

May import: core, artifacts, runtime.
"""

from ..core.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "repository": ("RepositoryRequest", "write_repository"),
    "contract": ("LAYOUTS", "DEVICES"),
    "local_server": ("LocalTritonServer", "ServerEnvironment"),
    "load": ("run_load", "LoadResult"),
})
