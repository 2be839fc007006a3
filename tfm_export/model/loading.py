"""One entry point for every checkpoint a user can name: the project's format, a seed checkpoint or a Hugging Face
model directory. It sits above both readers because the Hugging Face loaders build their models with the
project format's model building, so neither reader imports the other's caller."""

from __future__ import annotations

from pathlib import Path

from ..artifacts.manifest import is_hf_directory
from ..core.errors import VocabularyError
from .checkpoint import Checkpoint, load_own_checkpoint
from .huggingface import load_hf_checkpoint


def load_checkpoint(path: str | Path, vocab: list[Path] | None = None) -> Checkpoint:
    """Load any checkpoint; `vocab` overrides (own format) or supplies (seed) the vocabulary."""
    path = Path(path)
    if not is_hf_directory(path):
        return load_own_checkpoint(path, vocab)
    if vocab:
        raise VocabularyError(f"{path}: a Hugging Face model directory carries its own tokenizer; drop --vocab")
    return load_hf_checkpoint(path)
