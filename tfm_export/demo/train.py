"""The demo model: its config, its training pairs and the run that reproduces `models/demo/ckpt.pt`
(`make demo-model`)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from ..core.config import ModelConfig
from ..core.errors import CheckpointError
from ..core.tokenizer import Vocabulary, train_word_tokenizer
from ..model.checkpoint import CHECKPOINT_FILE, check_checkpoint_output, save_checkpoint
from ..model.train import TrainSettings, train
from ..model.transformer import Transformer
from . import numbers as demo_numbers


def demo_config(vocab_size: int) -> ModelConfig:
    """Small enough to train on two CPU cores in minutes, big enough for >= 97% exact match."""
    return ModelConfig(src_vocab_size=vocab_size, trg_vocab_size=vocab_size, d_model=128, d_inner=512,
                       n_layers=3, n_head=4, d_k=32, d_v=32, dropout=0.1,
                       proj_share_weight=True, embs_share_weight=True, scale_emb_or_prj="emb")


def demo_pair(rng: random.Random) -> tuple[str, str]:
    n = demo_numbers.training_number(rng)
    return demo_numbers.english(n), demo_numbers.french(n)


def train_demo(output: Path, settings: TrainSettings, progress: bool = True, force: bool = False) -> tuple[Path, float]:
    """Build the demo tokenizer and model, train, save; returns the checkpoint path and minutes taken. An
    existing checkpoint in `output` is replaced only with force (checked before training)."""
    check_checkpoint_output(output / CHECKPOINT_FILE, True, force)
    torch.manual_seed(settings.seed)
    tok = train_word_tokenizer(demo_numbers.corpus_for_vocabulary())
    vocab = Vocabulary(tok, tok)
    model = Transformer(demo_config(tok.vocab_size))
    start = time.perf_counter()
    train(model, vocab, demo_pair, settings, progress)
    minutes = (time.perf_counter() - start) / 60
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"{output}: cannot create the output directory ({exc.strerror})") from None
    path = save_checkpoint(model.eval(), vocab, output / CHECKPOINT_FILE, force=force,
                           extra={"training": {**settings.__dict__, "minutes": round(minutes, 2)}})
    return path, minutes
