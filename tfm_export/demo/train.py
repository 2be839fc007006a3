"""The demo model: its config, its training pairs and the run that reproduces `models/demo/ckpt.pt`
(`make demo-model`)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch

from ..core.config import ModelConfig
from ..core.errors import CheckpointError
from ..core.files import check_output_path
from ..core.tokenizer import Vocabulary, train_word_tokenizer
from ..core.variants import CLASSIC, GATED_ACTIVATIONS
from ..model.checkpoint import CHECKPOINT_FILE, check_checkpoint_output, save_checkpoint
from ..model.train import TrainSettings, train
from ..model.transformer import Transformer
from . import numbers as demo_numbers

DEMO_LAYERS = 3
DEMO_FFN = 512
GATED_DEMO_FFN = 344  # ~2/3 of DEMO_FFN: a gated FFN's three matrices hold as many weights as the classic two


def demo_config(vocab_size: int, variant: dict[str, Any] | None = None) -> ModelConfig:
    """Small enough to train on two CPU cores in minutes, big enough for >= 97% exact match. `variant`:
    the architecture options (core.variants), classic when not given."""
    gated = (variant or {}).get("activation") in GATED_ACTIVATIONS
    return ModelConfig(src_vocab_size=vocab_size, trg_vocab_size=vocab_size, d_model=128,
                       d_inner=GATED_DEMO_FFN if gated else DEMO_FFN, n_layers=DEMO_LAYERS, n_head=4, d_k=32, d_v=32,
                       dropout=0.1,
                       proj_share_weight=True, embs_share_weight=True, scale_emb_or_prj="emb", **(variant or {}))


def default_output(preset: str, variant: dict[str, Any]) -> Path:
    """models/demo for the classic model; another architecture never overwrites it."""
    return Path("models/demo") if variant == CLASSIC else Path(f"models/demo-{preset}")


def demo_pair(rng: random.Random) -> tuple[str, str]:
    n = demo_numbers.training_number(rng)
    return demo_numbers.english(n), demo_numbers.french(n)


def train_demo(output: Path, settings: TrainSettings, progress: bool = True, force: bool = False,
               variant: dict[str, Any] | None = None) -> tuple[Path, float]:
    """Build the demo tokenizer and model, train, save; returns the checkpoint path and minutes taken. An
    existing checkpoint in `output` is replaced only with force (checked before training). `variant`: the
    architecture options (core.variants), classic when not given."""
    check_checkpoint_output(output / CHECKPOINT_FILE, True, force)
    torch.manual_seed(settings.seed)
    tok = train_word_tokenizer(demo_numbers.corpus_for_vocabulary())
    vocab = Vocabulary(tok, tok)
    model = Transformer(demo_config(tok.vocab_size, variant))  # a bad architecture is refused first
    check_output_path(output, "--output", directory=True)  # before the minutes of training
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
