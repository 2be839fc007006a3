"""Translation without the export code. Open a model through the one door (backends.open_backend); the Translator
(text in, text out) calls its Searcher (search.py) once per batch: the loops of decoding.py over a step backend
(step.py says what a step is), or generate.onnx in one call. Each backend is one file of backends/, named by the
cache it drives. Importing the runtime loads neither PyTorch nor ONNX; a backend's libraries load when it is opened.

May import: core, artifacts, model (the PyTorch reference backend only).
"""

from ..core.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "translator": ("Translator", "DecodeOptions", "Translation"),
    "backends": ("open_backend", "BACKENDS"),
    "search": ("SearchOptions",),
    "session": ("SessionOptions",),
    "decoding": ("greedy", "beam_search"),
})
