"""A small trainer for the reference model: Adam with the paper's warm-up schedule, label smoothing,
teacher forcing. The demo model (demo.train) is trained with it."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..core.batching import pad_batch
from ..core.config import TrainSettings
from ..core.tokenizer import BOS_ID, EOS_ID, PAD_ID, TextTokenizer, Vocabulary
from .transformer import Transformer

PairSampler = Callable[[random.Random], tuple[str, str]]


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
