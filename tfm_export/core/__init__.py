"""Facts every stage shares: the model config, the graph contract, special tokens and tokenizers, source
length limits, hypotheses, batching, file hashing and atomic writes, the one error type, optional extras.

May import: nothing else in tfm_export; no PyTorch, ONNX or ONNX Runtime (NumPy and tokenizers only).
"""

from .lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "config": ("ModelConfig", "TrainSettings"),
    "errors": ("TfmExportError", "InputTextError"),
    "graph_spec": ("Graph", "GraphSpec", "contract_specs", "cache_names"),
    "tokenizer": ("TextTokenizer", "Vocabulary", "load_tokenizer"),
    "hypothesis": ("Hypothesis",),
    "sources": ("encode_lines", "read_text_lines"),
    "files": ("write_atomically", "file_sha256"),
    "extras": ("require_extra",),
})
