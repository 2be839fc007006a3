"""PyTorch -> ONNX: the two graphs of the contract exported from the reference model, checked against the
graph spec, written as a model directory, and proven equal to PyTorch (parity); `inspect`; generate.onnx (ONNX
Runtime's in-graph beam search wrapped around the two graphs). The ONNX-only helpers (onnx_io, inputs,
parity's tolerances, roles: which nodes are RMSNorm, RoPE, relative bias) load no PyTorch, so later stages
reuse them.

May import: core, artifacts, model, runtime.
"""

from ..core.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "pipeline": ("export_model_dir",),
    "export": ("export_all",),
    "onnx_io": ("check_contract", "load_graph", "save_graph"),
    "parity": ("compare_stepwise", "Tolerance"),
    "inspection": ("inspect_model",),
    "generate": ("generate_graph",),
    "generate_dir": ("write_generate_dir",),
})
