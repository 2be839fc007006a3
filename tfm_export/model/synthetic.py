"""Random-weight models of any size with a word-list vocabulary, for benchmarks and tests of the base config.

Their outputs mean nothing, but every tensor has the real shapes and value ranges of the seed's
initialisation, which is all that export, quantization and timing depend on.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from ..core.config import ModelConfig
from ..core.errors import CheckpointError
from ..core.tokenizer import Vocabulary, plain_word_tokenizer
from .checkpoint import CHECKPOINT_FILE, check_checkpoint_output, save_checkpoint
from .transformer import Transformer

SPECIALS = ["<unk>", "<blank>", "<s>", "</s>"]


def random_checkpoint(config: ModelConfig, directory: Path, seed: int = 0, force: bool = False) -> Path:
    """ckpt.pt + tokenizer.json (tokens w0, w1, ...) in `directory`; one shared vocabulary. An existing
    checkpoint there is replaced only with force."""
    check_checkpoint_output(directory / CHECKPOINT_FILE, True, force)
    torch.manual_seed(seed)
    model = Transformer(config).eval()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"{directory}: cannot create the output directory ({exc.strerror})") from None
    return save_checkpoint(model, random_vocabulary(config), directory / CHECKPOINT_FILE, force=force)


def random_vocabulary(config: ModelConfig) -> Vocabulary:
    """The special tokens, then words w0, w1, ...: one vocabulary for both sides, as large as the larger."""
    words = [f"w{i}" for i in range(max(config.src_vocab_size, config.trg_vocab_size) - len(SPECIALS))]
    tok = plain_word_tokenizer([*SPECIALS, *words], "random")
    return Vocabulary(tok, tok)


def random_texts(config: ModelConfig, count: int, min_words: int = 5, max_words: int = 30,
                 seed: int = 0) -> list[str]:
    """Sentences of the random vocabulary's words, for calibration and timing."""
    rng = random.Random(seed)
    words = config.src_vocab_size - len(SPECIALS)
    return [" ".join(f"w{rng.randrange(words)}" for _ in range(rng.randint(min_words, max_words)))
            for _ in range(count)]
