"""A small trainer for the demo model: Adam with the paper's warm-up schedule, label smoothing,
teacher forcing. It reproduces `models/demo/ckpt.pt` (`make demo-model`)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import demo_numbers
from .batching import pad_batch
from .checkpoint import save_checkpoint
from .config import ModelConfig
from .errors import CheckpointError
from .model import Transformer
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, TextTokenizer, Vocabulary, train_word_tokenizer

PairSampler = Callable[[random.Random], tuple[str, str]]


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 2000
    batch_size: int = 128
    warmup_steps: int = 400
    lr_mul: float = 1.0  # peak lr = lr_mul * d_model^-0.5 * warmup^-0.5
    label_smoothing: float = 0.1
    seed: int = 1


def demo_config(vocab_size: int) -> ModelConfig:
    """Small enough to train on two CPU cores in minutes, big enough for >= 97% exact match."""
    return ModelConfig(src_vocab_size=vocab_size, trg_vocab_size=vocab_size, d_model=128, d_inner=512,
                       n_layers=3, n_head=4, d_k=32, d_v=32, dropout=0.1,
                       proj_share_weight=True, embs_share_weight=True, scale_emb_or_prj="emb")


def make_batch(pairs: list[tuple[str, str]], vocab: Vocabulary) -> tuple[torch.Tensor, torch.Tensor]:
    """Source and target ids wrapped in <s> ... </s>, as the seed's data fields do."""
    def wrap(tok: TextTokenizer, text: str) -> list[int]:
        return [BOS_ID, *tok.encode(text), EOS_ID]
    return (torch.from_numpy(pad_batch([wrap(vocab.source, s) for s, _ in pairs])),
            torch.from_numpy(pad_batch([wrap(vocab.target, t) for _, t in pairs])))


def warmup_schedule(d_model: int, warmup: int, lr_mul: float) -> Callable[[int], float]:
    """The paper's lr: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)."""
    def lr(step: int) -> float:
        step = max(step, 1)
        return lr_mul * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    return lr


def train(model: Transformer, vocab: Vocabulary, sample: PairSampler, settings: TrainSettings,
          progress: bool = True) -> list[float]:
    """Teacher-forced training; returns the loss of every step."""
    rng = random.Random(settings.seed)
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_schedule(model.config.d_model, settings.warmup_steps, settings.lr_mul))
    model.train()
    losses = []
    bar = tqdm(range(settings.steps), desc="training", unit="step", disable=not progress)
    for _ in bar:
        src, trg = make_batch([sample(rng) for _ in range(settings.batch_size)], vocab)
        logits = model(src, trg[:, :-1])  # teacher forcing: predict trg[1:] from trg[:-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), trg[:, 1:].reshape(-1),
                               ignore_index=PAD_ID, label_smoothing=settings.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    return losses


def demo_pair(rng: random.Random) -> tuple[str, str]:
    n = demo_numbers.training_number(rng)
    return demo_numbers.english(n), demo_numbers.french(n)


def train_demo(output: Path, settings: TrainSettings, progress: bool = True) -> tuple[Path, float]:
    """Build the demo tokenizer and model, train, save; returns the checkpoint path and minutes taken."""
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
    path = save_checkpoint(model.eval(), vocab, output / "ckpt.pt",
                           extra={"training": {**settings.__dict__, "minutes": round(minutes, 2)}})
    return path, minutes
