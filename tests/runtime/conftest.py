"""The runtime tests' models: random and flat (beams reshuffle every step, hypotheses both end and get cut), and
tied (every logit equal), each exported once per run and shared by the test files and workers that use them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.common import made_once, tiny_config

from tfm_export.core.tokenizer import EOS_ID
from tfm_export.graphs.pipeline import export_model_dir
from tfm_export.model.checkpoint import save_checkpoint
from tfm_export.model.loading import load_checkpoint
from tfm_export.model.synthetic import random_checkpoint
from tfm_export.model.transformer import Transformer


def _flat(root: Path) -> None:
    """A random model with flat next-token distributions and </s> a little more likely than a word (its row of
    the tied projection doubled), so hypotheses both end and get cut at every length penalty; and its export."""
    cfg = tiny_config(n_position=24, src_vocab_size=19, trg_vocab_size=19)
    random = load_checkpoint(random_checkpoint(cfg, root / "random", seed=5))
    with torch.no_grad():
        random.model.trg_word_prj.weight[EOS_ID] *= 2
    (root / "ckpt").mkdir()
    save_checkpoint(random.model, random.vocab, root / "ckpt" / "ckpt.pt")
    export_model_dir(load_checkpoint(root / "ckpt" / "ckpt.pt"), root / "model", progress=False)


def _tied(root: Path) -> None:
    """A model whose output projection is zero: every logit equal, so every step is a tie at every cut."""
    torch.manual_seed(0)
    base = load_checkpoint(random_checkpoint(tiny_config(src_vocab_size=13, trg_vocab_size=13), root / "a"))
    model = Transformer(tiny_config(src_vocab_size=13, trg_vocab_size=13, proj_share_weight=False)).eval()
    with torch.no_grad():
        model.trg_word_prj.weight.zero_()
    (root / "ckpt").mkdir()
    save_checkpoint(model, base.vocab, root / "ckpt" / "ckpt.pt")
    export_model_dir(load_checkpoint(root / "ckpt" / "ckpt.pt"), root / "model", progress=False)


@pytest.fixture(scope="session")
def flat(tmp_path_factory):
    root = made_once(tmp_path_factory, "runtime-flat", _flat)
    return load_checkpoint(root / "ckpt" / "ckpt.pt"), root / "model"


@pytest.fixture(scope="session")
def tied(tmp_path_factory):
    root = made_once(tmp_path_factory, "runtime-tied", _tied)
    return load_checkpoint(root / "ckpt" / "ckpt.pt"), root / "model"
